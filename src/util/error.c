/*
 * util/error.c: error names and the per-thread error detail. The detail is a
 * fixed-size thread-local struct: setting it never allocates, so it works
 * when memory has run out.
 */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local idem_error last_error;

static void set_message(const char *fmt, va_list ap)
{
	vsnprintf(last_error.message, sizeof(last_error.message), fmt, ap);
}

int idem__error(int code, const char *fmt, ...)
{
	va_list ap;

	last_error.code = code;
	last_error.driver_code = 0;
	last_error.sqlstate[0] = '\0';
	va_start(ap, fmt);
	set_message(fmt, ap);
	va_end(ap);
	return code;
}

int idem__error_driver(int code, int driver_code, const char *sqlstate, const char *fmt, ...)
{
	va_list ap;

	last_error.code = code;
	last_error.driver_code = driver_code;
	snprintf(last_error.sqlstate, sizeof(last_error.sqlstate), "%s", sqlstate ? sqlstate : "");
	va_start(ap, fmt);
	set_message(fmt, ap);
	va_end(ap);
	return code;
}

int idem__error_arg(const char *func, const char *expr)
{
	return idem__error(IDEM_EINVAL, "%s: invalid argument: %s", func, expr);
}

void idem__error_clear(void)
{
	memset(&last_error, 0, sizeof(last_error));
}

void idem__error_restore(const idem_error *e)
{
	last_error = *e;
}

const idem_error *idem_error_last(void)
{
	return &last_error;
}

const char *idem_strerror(int code)
{
	switch (code) {
	case IDEM_OK: return "success";
	case IDEM_EINVAL: return "invalid argument";
	case IDEM_ENOMEM: return "out of memory";
	case IDEM_EUNAVAIL: return "store unavailable";
	case IDEM_ERETRY: return "transient store conflict, retry";
	case IDEM_ECONSTRAINT: return "constraint violation";
	case IDEM_ECONFLICT: return "unique key conflict on a business row";
	case IDEM_ESTORE: return "store error";
	case IDEM_ECORRUPT: return "database corrupt or not a database";
	case IDEM_ESCHEMA: return "schema version not supported";
	case IDEM_ENOTFOUND: return "not found";
	case IDEM_ELEASE: return "lease lost to another caller";
	case IDEM_ECLOSED: return "shutting down";
	case IDEM_EWOULDBLOCK: return "would wait";
	default: return "unknown error";
	}
}

idem_error_class idem_error_classify(int code)
{
	switch (code) {
	case IDEM_OK: return IDEM_ECLASS_NONE;
	case IDEM_ERETRY: return IDEM_ECLASS_RETRYABLE;
	case IDEM_EUNAVAIL:
	case IDEM_ECLOSED: return IDEM_ECLASS_UNAVAILABLE;
	case IDEM_ECONSTRAINT:
	case IDEM_ECONFLICT: return IDEM_ECLASS_CONSTRAINT;
	default: return IDEM_ECLASS_OTHER;
	}
}

const char *idem_error_class_name(idem_error_class cls)
{
	switch (cls) {
	case IDEM_ECLASS_NONE: return "none";
	case IDEM_ECLASS_RETRYABLE: return "retryable";
	case IDEM_ECLASS_UNAVAILABLE: return "unavailable";
	case IDEM_ECLASS_CONSTRAINT: return "constraint";
	default: return "other";
	}
}
