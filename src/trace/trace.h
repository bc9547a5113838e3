/* The timeline, as the parts above trace use it: the recorder and its measure (recorder.h) and
 * its two writers, Chrome trace JSON (chrome_trace.h) and a self-contained SVG picture
 * (svg_timeline.h). The files of src/trace include those headers themselves, each only what it
 * builds on, never this one. */
#ifndef GP_TRACE_TRACE_H
#define GP_TRACE_TRACE_H

#include "trace/chrome_trace.h"
#include "trace/recorder.h"
#include "trace/svg_timeline.h"

#endif
