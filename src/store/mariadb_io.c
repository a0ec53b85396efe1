/*
 * store/mariadb_io.c: the MariaDB driver's calls to the server: every
 * error mapped to an idem code (DESIGN.md §1), and every call that waits
 * made on Connector/C's non-blocking API and bounded (its I/O timeout, cut
 * to its connection's deadline; a server that stops answering fails the
 * call as unavailable and the connection is shut down, never reused).
 * The lowest layer of the driver: it calls nothing above it by name; the
 * one question it asks of the statements goes through c->lost_statement.
 */
#include <errmsg.h>
#include <errno.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "store/mariadb_int.h"
#include "util/clock.h"
#include "util/error.h"

/* ---- errors ---------------------------------------------------------- */

/* "Duplicate entry '...' for key 'idem_records_key'": the key name ends it. */
static int on_idem_index(const char *msg)
{
	static const char tail[] = "for key 'idem_records_key'";
	size_t n = strlen(msg), t = sizeof(tail) - 1;

	return n >= t && strcmp(msg + n - t, tail) == 0;
}

/* Map a MariaDB error to an idem code; records errno and SQLSTATE. */
static int classify(conn *c, unsigned int err, const char *state, const char *msg, err_ctx ctx,
                    const char *what)
{
	int code;

	if (c->lost)
		return idem__error_driver(strcmp(what, "commit") == 0 ? IDEM_EUNAVAIL : IDEM_ERETRY,
		                          ER_LOCK_DEADLOCK, "40001",
		                          "mariadb: %s: the server dropped the statement of a "
		                          "transaction it had rolled back (a Galera brute-force "
		                          "abort); connection dropped",
		                          what);
	if (c->base.timed_out)
		return idem__error_driver(IDEM_EUNAVAIL, CR_SERVER_LOST, "HY000",
		                          "mariadb: %s: the server did not answer before the "
		                          "deadline; connection dropped",
		                          what);
	switch (err) {
	case ER_DUP_ENTRY:               /* 1062 */
	case ER_DUP_ENTRY_WITH_KEY_NAME: /* 1586 */
		if (ctx == CTX_CLAIM && on_idem_index(msg))
			return IDEM__DUPLICATE;
		code = ctx == CTX_BUSINESS ? IDEM_ECONFLICT : IDEM_ESTORE;
		break;
	case ER_LOCK_DEADLOCK: /* 1213: the transaction was rolled back (also Galera) */
	case ER_LOCK_WAIT_TIMEOUT: /* 1205 */ code = IDEM_ERETRY; break;
	case ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: /* 1792 */
		/* A pooled session is READ ONLY outside START TRANSACTION READ WRITE
		 * (drv_connect): a write refused so ran after the unit's transaction
		 * was rolled back under it. Nothing was written; retry afresh. */
		c->base.broken = 1;
		code = IDEM_ERETRY;
		break;
	case ER_BAD_NULL_ERROR:       /* 1048 */
	case ER_NO_DEFAULT_FOR_FIELD: /* 1364 */
	case ER_NO_REFERENCED_ROW_2:  /* 1452 */
	case ER_ROW_IS_REFERENCED_2:  /* 1451 */
	case ER_NO_REFERENCED_ROW:    /* 1216 */
	case ER_ROW_IS_REFERENCED:    /* 1217 */
	case 3819:                    /* MySQL's CHECK violation */
	case 4025:                    /* MariaDB's CHECK violation: ER_CONSTRAINT_FAILED */
		code = IDEM_ECONSTRAINT;
		break;
	case CR_CONNECTION_ERROR:     /* 2002 */
	case CR_CONN_HOST_ERROR:      /* 2003 */
	case CR_SERVER_GONE_ERROR:    /* 2006 */
	case CR_SERVER_LOST:          /* 2013 */
	case CR_SERVER_LOST_EXTENDED: /* 2055 */
	case ER_CONNECTION_KILLED:    /* 1927 */
	case ER_SERVER_SHUTDOWN:      /* 1053 */
	case 4031:                    /* disconnected by the server for inactivity */
		c->base.broken = 1;
		code = IDEM_EUNAVAIL;
		break;
	case 1264: /* ER_WARN_DATA_OUT_OF_RANGE: a value outside its column's range */
	case 1690: /* ER_DATA_OUT_OF_RANGE: an expression's result out of range */
		/* The request's values, not the store: permanent, never "unavailable". */
		code = IDEM_EINVAL;
		break;
	case 1969: /* ER_STATEMENT_TIMEOUT: max_statement_time, the server's own bound */
	case ER_CON_COUNT_ERROR: /* 1040: too many connections */ code = IDEM_EUNAVAIL; break;
	case CR_OUT_OF_MEMORY: /* 2008 */
		c->base.broken = 1;
		code = IDEM_ENOMEM;
		break;
	default:
		/* Any other client-side error leaves the protocol state in doubt. */
		if (err >= 2000 && err < 3000)
			c->base.broken = 1;
		code = IDEM_ESTORE;
		break;
	}
	return idem__error_driver(code, (int)err, state, "mariadb: %s: %s (errno %u)", what, msg,
	                          err);
}

int idem__my_fail_conn(conn *c, err_ctx ctx, const char *what)
{
	return classify(c, mysql_errno(c->my), mysql_sqlstate(c->my), mysql_error(c->my), ctx,
	                what);
}

int idem__my_fail_stmt(conn *c, MYSQL_STMT *st, err_ctx ctx, const char *what)
{
	return classify(c, mysql_stmt_errno(st), mysql_stmt_sqlstate(st), mysql_stmt_error(st), ctx,
	                what);
}

/* ---- waiting for the server ----------------------------------------- */

void idem__my_arm(conn *c, int bound_ms)
{
	int64_t now = idem__clock_monotonic_us(), until = now + (int64_t)bound_ms * 1000;

	c->call_start_us = now;
	c->lost = 0;
	c->call_until_us =
	    c->base.deadline_us > 0 && c->base.deadline_us < until ? c->base.deadline_us : until;
}

/*
 * Wait for what a non-blocking call asked for (MYSQL_WAIT_* in status), at
 * most until the call's bound. The events for its _cont call, or 0 when the
 * bound passed first: c is then timed out and broken, the call abandoned.
 */
int idem__my_wait_io(conn *c, int status)
{
	struct pollfd pfd = {mysql_get_socket(c->my), 0, 0};
	int64_t lib_until = 0, probe_at = 0;

	if (status & MYSQL_WAIT_READ)
		pfd.events |= POLLIN;
	if (status & MYSQL_WAIT_WRITE)
		pfd.events |= POLLOUT;
	if (status & MYSQL_WAIT_EXCEPT)
		pfd.events |= POLLPRI;
	if (status & MYSQL_WAIT_TIMEOUT)
		lib_until =
		    idem__clock_monotonic_us() + (int64_t)mysql_get_timeout_value_ms(c->my) * 1000;
	/* A unit's statement waiting for its answer is checked on now and then
	 * (idem__my_lost_statement says why). */
	if (c->in_unit && (status & MYSQL_WAIT_READ) && c->call_start_us > 0 && c->lost_statement)
		probe_at = c->call_start_us + (int64_t)PROBE_MS * 1000;
	for (;;) {
		int left = idem__net_wait_ms(c->call_until_us, 0), lib = -1, n, ev = 0, probe = -1;

		if (left == 0) {
			/* Abandoned mid-call: shut the socket now, so that nothing the
			 * driver still does on this handle (freeing a statement's
			 * result, closing it) waits for the server. */
			c->base.broken = c->base.timed_out = 1;
			if (pfd.fd >= 0)
				shutdown(pfd.fd, SHUT_RDWR);
			return 0;
		}
		if (lib_until)
			lib = idem__net_wait_ms(lib_until, 0);
		if (probe_at && (probe = idem__net_wait_ms(probe_at, 0)) == 0) {
			int64_t now = idem__clock_monotonic_us();

			if (c->lost_statement(c, (now - c->call_start_us) / 1000)) {
				c->base.broken = c->lost = 1;
				if (pfd.fd >= 0)
					shutdown(pfd.fd, SHUT_RDWR);
				return 0;
			}
			probe_at = now + (int64_t)PROBE_MS * 1000;
			continue;
		}
		if (probe > 0 && probe < left && (lib < 0 || probe < lib))
			left = probe;
		n = poll(&pfd, pfd.fd >= 0 ? 1 : 0, lib >= 0 && lib < left ? lib : left);
		if (n < 0 && errno != EINTR) {
			c->base.broken = 1;
			return MYSQL_WAIT_TIMEOUT; /* let the driver fail the call */
		}
		if (n > 0) {
			if (pfd.revents & (POLLIN | POLLERR | POLLHUP))
				ev |= MYSQL_WAIT_READ;
			if (pfd.revents & (POLLOUT | POLLERR | POLLHUP))
				ev |= MYSQL_WAIT_WRITE;
			if (pfd.revents & POLLPRI)
				ev |= MYSQL_WAIT_EXCEPT;
			return ev ? ev & status : status;
		}
		if (n == 0 && lib_until && lib >= 0 && lib <= left)
			return MYSQL_WAIT_TIMEOUT; /* the driver's own read/connect timeout */
	}
}

int idem__my_nb_query(conn *c, const char *sql, unsigned long len)
{
	int ret = 1;

	idem__my_arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_real_query_start(&ret, c->my, sql, len), mysql_real_query_cont, c->my);
	return c->base.timed_out || c->lost ? 1 : ret;
}

MYSQL_RES *idem__my_nb_store_result(conn *c)
{
	MYSQL_RES *ret = NULL;

	idem__my_arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_store_result_start(&ret, c->my), mysql_store_result_cont, c->my);
	return c->base.timed_out || c->lost ? NULL : ret;
}

int idem__my_nb_stmt_prepare(conn *c, MYSQL_STMT *st, const char *sql, unsigned long len)
{
	int ret = 1;

	idem__my_arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_prepare_start(&ret, st, sql, len), mysql_stmt_prepare_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}

int idem__my_nb_stmt_execute(conn *c, MYSQL_STMT *st)
{
	int ret = 1;

	idem__my_arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_execute_start(&ret, st), mysql_stmt_execute_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}

int idem__my_nb_stmt_store_result(conn *c, MYSQL_STMT *st)
{
	int ret = 1;

	idem__my_arm(c, c->io_timeout_ms);
	NB_RUN(c, ret, mysql_stmt_store_result_start(&ret, st), mysql_stmt_store_result_cont, st);
	return c->base.timed_out || c->lost ? 1 : ret;
}
