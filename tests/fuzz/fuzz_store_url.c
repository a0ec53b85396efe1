/*
 * tests/fuzz/fuzz_store_url.c: store URL parsing. The mysql:// parser
 * (src/store/mariadb_url.c, idem__my_url_parse) on any bytes; idem_store_open on
 * every URL it must refuse without connecting: an unknown scheme, sqlite:
 * with no path or a URI, a postgresql: URL libpq cannot parse.
 */
#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_env.h"

#include "store/mariadb_int.h"

static int starts(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void check_mysql(const char *t)
{
	my_url u;

	if (idem__my_url_parse(&u, t) < 0) {
		if (u.user || u.password || u.host || u.db || u.socket)
			fuzz_fail("failed URL parse left parts behind");
		return;
	}
	if (!u.user || !*u.user || !u.host || !u.db || !*u.db)
		fuzz_fail("mysql URL accepted without user, host or database");
	if (!*u.host && !u.socket)
		fuzz_fail("mysql URL accepted without host or socket");
	if (u.port > 65535)
		fuzz_fail("port out of range");
	idem__my_url_clear(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	char *url = fuzz_strndup(data, size);
	idem_store *s = NULL;
	int refuse = 0;

	opts.migrate = 0;
	check_mysql(url);
	if (starts(url, "mysql:"))
		check_mysql(url + 6);
	if (starts(url, "sqlite:")) {
		refuse = url[7] == '\0' || starts(url + 7, "file:");
	} else if (starts(url, "postgresql:") || starts(url, "postgres:")) {
		const char *t = url + (url[8] == ':' ? 9 : 11);

		if (!starts(t, "//")) {
			refuse = 1;
		} else {
			char full[4096], *err = NULL;
			PQconninfoOption *info;

			if (strlen(t) < sizeof(full) - 12) {
				memcpy(full, "postgresql:", 11);
				memcpy(full + 11, t, strlen(t) + 1);
				info = PQconninfoParse(full, &err);
				refuse = info == NULL;
				PQconninfoFree(info);
				PQfreemem(err);
			}
		}
	} else if (!starts(url, "mysql:") && !starts(url, "mariadb:")) {
		refuse = 1; /* no such scheme */
	}
	if (refuse) {
		int rc = idem_store_open(&s, url, &opts);

		if (rc != IDEM_EINVAL || s)
			fuzz_fail("bad store URL not refused with IDEM_EINVAL");
		if (!idem_error_last()->message[0])
			fuzz_fail("refused store URL without a message");
	}
	free(url);
	return 0;
}
