/*
 * idem/common.h: the export macro, error codes and the thread-local error
 * detail shared by every part of the public API. Nothing here allocates; the
 * error detail is per thread and is overwritten by the next failing call made
 * on that thread.
 *
 * Arguments. Every public call checks what its header states about its
 * arguments (libgit2's GIT_ASSERT_ARG): a NULL handle, or NULL for a
 * pointer the call needs, is answered IDEM_EINVAL with the argument named in
 * idem_error_last() ("idem_store_ping: invalid argument: store"), never a
 * crash or an abort. A call that returns something other than an error code
 * says what it answers instead; calls that accept NULL (close, free, clear,
 * optional out-params and options) say so.
 */
#ifndef IDEM_COMMON_H
#define IDEM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && defined(IDEM_BUILDING)
#define IDEM_EXTERN __attribute__((visibility("default")))
#else
#define IDEM_EXTERN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Error codes. 0 is success; errors are negative and this list only grows.
 * Outcomes of a claim (FIRST, REPLAY, ...) are never errors: see claim.h.
 */
typedef enum {
	IDEM_OK = 0,
	IDEM_EINVAL = -1,   /* a bad argument: invalid key, scope, URL, JSON */
	IDEM_ENOMEM = -2,   /* out of memory */
	IDEM_EUNAVAIL = -3, /* the store cannot be reached or opened (I/O, lost connection) */
	IDEM_ERETRY = -4,   /* transient: busy, locked, deadlock, serialization; retry the unit */
	IDEM_ECONSTRAINT =
	    -5,              /* NOT NULL, CHECK, foreign key or similar violation in business SQL */
	IDEM_ECONFLICT = -6, /* a UNIQUE index on a business row rejected the write */
	IDEM_ESTORE = -7,    /* any other store error (SQL error, full disk, ...) */
	IDEM_ECORRUPT = -8,  /* the database file is not a database or is damaged */
	IDEM_ESCHEMA = -9,   /* the schema is newer than this library or missing */
	IDEM_ENOTFOUND = -10,   /* no such record */
	IDEM_ELEASE = -11,      /* the claim's lease was lost: another caller took it over */
	IDEM_ECLOSED = -12,     /* the store or executor is shutting down */
	IDEM_EWOULDBLOCK = -13, /* a _nowait call would have to wait: nothing was done */
} idem_error_code;

/* Class of a store failure, for metrics and for deciding what a caller does. */
typedef enum {
	IDEM_ECLASS_NONE = 0,
	IDEM_ECLASS_RETRYABLE, /* retried by the library; surfaced only when retries ran out */
	IDEM_ECLASS_UNAVAILABLE,
	IDEM_ECLASS_CONSTRAINT,
	IDEM_ECLASS_OTHER,
} idem_error_class;

/* Detail of the last error on this thread. */
typedef struct {
	int code;          /* an idem_error_code */
	int driver_code;   /* SQLite extended result code, MariaDB errno, 0 if none */
	char sqlstate[6];  /* PostgreSQL/MariaDB SQLSTATE, "" if none */
	char message[512]; /* human-readable, includes the driver's own message */
} idem_error;

/*
 * A static, human-readable name for an error code ("store unavailable").
 * Never NULL; unknown codes give "unknown error".
 */
IDEM_EXTERN const char *idem_strerror(int code);

/*
 * The last error recorded on the calling thread. Borrowed: valid until the
 * next idem call on this thread. Never NULL; code is 0 when none is set.
 */
IDEM_EXTERN const idem_error *idem_error_last(void);

/* The class of an error code (IDEM_ERETRY is RETRYABLE, and so on). */
IDEM_EXTERN idem_error_class idem_error_classify(int code);

/* Short stable name of a class, for labels: "retryable", "unavailable", ... */
IDEM_EXTERN const char *idem_error_class_name(idem_error_class cls);

#ifdef __cplusplus
}
#endif
#endif
