/*
 * util/error.h: setting the thread-local error detail from inside the
 * library. Never prints; the caller decides what to show.
 */
#ifndef IDEM_UTIL_ERROR_H
#define IDEM_UTIL_ERROR_H

#include "idem/common.h"

/* Record code with a printf-style message; returns code for `return idem__error(...)`. */
int idem__error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same, with the driver's own code and SQLSTATE (may be NULL). */
int idem__error_driver(int code, int driver_code, const char *sqlstate, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void idem__error_clear(void);

/* Make e this thread's last error (carrying a result across threads). */
void idem__error_restore(const idem_error *e);

#endif
