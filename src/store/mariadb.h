/*
 * store/mariadb.h: the one internal entry point of the MariaDB backend
 * besides its ops table: a plain client connection from a mysql:// URL, for
 * tests and tools that need the server itself (creating databases, KILL).
 * Never used by the library's own paths.
 */
#ifndef IDEM_STORE_MARIADB_H
#define IDEM_STORE_MARIADB_H

struct st_mysql;

/*
 * Connect to the server and database of url ("mysql://..." or
 * "mariadb://..."), with the store's session settings. Returns the handle
 * (close it with mysql_close) or NULL with idem_error_last() set.
 */
struct st_mysql *idem__mariadb_connect(const char *url);

#endif
