/* The SVG timeline writer (svg_timeline.c): the recorded timeline as a self-contained picture
 * (--timeline). */
#ifndef GP_TRACE_SVG_TIMELINE_H
#define GP_TRACE_SVG_TIMELINE_H

#include "trace/recorder.h"

/* One row per stage, one box per event coloured by kind with its micro-batch number, idle time
 * blank, a legend, a time axis in ms and a title with the bubble. Written as the Chrome trace
 * is (chrome_trace.h): a temporary file next to path, fsynced and renamed onto it; errors
 * (GP_IO) name the path and the system's reason. */
gp_status gp_trace_write_svg(const gp_trace *t, const char *path);

#endif
