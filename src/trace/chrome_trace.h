/* The Chrome trace writer (chrome_trace.c): the recorded timeline as JSON for Perfetto and
 * chrome://tracing (--trace). */
#ifndef GP_TRACE_CHROME_TRACE_H
#define GP_TRACE_CHROME_TRACE_H

#include "trace/recorder.h"

/* Writes to a temporary file next to path, fsyncs it and renames it onto path, so a failure
 * never leaves a partial file; errors (GP_IO) name the path and the system's reason.
 * Complete events (ph "X", ts and dur in microseconds, pid 0, tid = stage, name "F3" / "B3" /
 * "R3" ..., cat = kind, args.micro_batch), one thread_name track "stage k" per stage. */
gp_status gp_trace_write_chrome(const gp_trace *t, const char *path);

#endif
