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

/*
 * IDEM_EINVAL, with "func: invalid argument: expr" as the detail: what a
 * public call answers when a stated assumption about an argument fails.
 */
int idem__error_arg(const char *func, const char *expr);

/*
 * A stated assumption about an argument of a public call, checked (libgit2's
 * GIT_ASSERT_ARG): a caller's mistake becomes IDEM_EINVAL with the
 * expression in idem_error_last(), never a crash or an abort. The first
 * thing a public call does, before anything touches the argument.
 */
#define IDEM__ASSERT_ARG(expr)                                                                     \
	do {                                                                                       \
		if (!(expr))                                                                       \
			return idem__error_arg(__func__, #expr);                                   \
	} while (0)

/*
 * The same for a call that answers something other than an int: the error
 * detail is set and fail is returned (GIT_ASSERT_ARG_WITH_RETVAL). Its
 * header says what fail is. For a void call: IDEM__ASSERT_ARG_VOID.
 */
#define IDEM__ASSERT_ARG_WITH_RETVAL(expr, fail)                                                   \
	do {                                                                                       \
		if (!(expr)) {                                                                     \
			idem__error_arg(__func__, #expr);                                          \
			return fail;                                                               \
		}                                                                                  \
	} while (0)

#define IDEM__ASSERT_ARG_VOID(expr)                                                                \
	do {                                                                                       \
		if (!(expr)) {                                                                     \
			idem__error_arg(__func__, #expr);                                          \
			return;                                                                    \
		}                                                                                  \
	} while (0)

/* Make e this thread's last error (carrying a result across threads). */
void idem__error_restore(const idem_error *e);

#endif
