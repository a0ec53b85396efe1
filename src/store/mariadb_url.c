/*
 * store/mariadb_url.c: mysql:// (and mariadb://) URLs, percent-decoded.
 * The password is wiped from memory when the URL is cleared, and never
 * appears in an error message.
 */
#include <stdlib.h>
#include <string.h>

#include "store/mariadb_int.h"
#include "util/error.h"

/* ---- URLs ------------------------------------------------------------ */

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* Percent-decode s[0..len) into a new string; no NUL bytes allowed. */
static int decode(const char *s, size_t len, char **out)
{
	char *d = malloc(len + 1);
	size_t o = 0;

	*out = NULL;
	if (!d)
		return idem__error(IDEM_ENOMEM, "out of memory");
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '%') {
			int hi = -1, lo = -1;

			if (i + 2 < len) {
				hi = hexval(s[i + 1]);
				lo = hexval(s[i + 2]);
			}
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
				free(d);
				return idem__error(IDEM_EINVAL, "mariadb URL: bad percent escape");
			}
			d[o++] = (char)(hi * 16 + lo);
			i += 2;
		} else {
			d[o++] = s[i];
		}
	}
	d[o] = '\0';
	*out = d;
	return 0;
}

static void wipe_free(char *s)
{
	if (!s)
		return;
	/* volatile: the password must not survive in freed memory. */
	for (volatile char *p = s; *p; p++)
		*p = '\0';
	free(s);
}

void idem__my_url_clear(my_url *u)
{
	free(u->user);
	wipe_free(u->password);
	free(u->host);
	free(u->db);
	free(u->socket);
	memset(u, 0, sizeof(*u));
}

/* The one answer to a malformed URL: it never echoes the URL (a password). */
static int bad_url(void)
{
	return idem__error(IDEM_EINVAL, "mariadb URL must look like mysql://user[:password]@host"
	                                "[:port]/db[?socket=PATH]");
}

/* "user[:password]" from auth to the '@' at at; the user is required. */
static int parse_userinfo(my_url *u, const char *auth, const char *at)
{
	const char *colon = NULL;
	int rc;

	for (const char *p = auth; p < at; p++)
		if (*p == ':') {
			colon = p;
			break;
		}
	if ((rc = decode(auth, (size_t)((colon ? colon : at) - auth), &u->user)) < 0)
		return rc;
	if (!*u->user)
		return bad_url(); /* ":password@" alone: the user is still required */
	if (colon && (rc = decode(colon + 1, (size_t)(at - colon - 1), &u->password)) < 0)
		return rc;
	return 0;
}

/* "host[:port]" from hp to end; host may be an IPv6 literal in brackets. */
static int parse_hostport(my_url *u, const char *hp, const char *end)
{
	const char *colon;
	int rc;

	if (*hp == '[') {
		const char *close = memchr(hp, ']', (size_t)(end - hp));

		if (!close)
			return bad_url();
		if ((rc = decode(hp + 1, (size_t)(close - hp - 1), &u->host)) < 0)
			return rc;
		colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
		if (close + 1 < end && !colon)
			return bad_url();
	} else {
		colon = memchr(hp, ':', (size_t)(end - hp));
		if ((rc = decode(hp, (size_t)((colon ? colon : end) - hp), &u->host)) < 0)
			return rc;
	}
	if (colon) {
		unsigned long port = 0;

		if (colon + 1 == end)
			return bad_url();
		for (const char *p = colon + 1; p < end; p++) {
			if (*p < '0' || *p > '9' || port > 65535)
				return bad_url();
			port = port * 10 + (unsigned long)(*p - '0');
		}
		if (port == 0 || port > 65535)
			return bad_url();
		u->port = (unsigned int)port;
	}
	return 0;
}

/* What follows the database: "?socket=PATH" or nothing. */
static int parse_options(my_url *u, const char *q)
{
	int rc;

	while (*q == '?' || *q == '&') {
		const char *key = q + 1, *val, *end = key + strcspn(key, "&#");

		val = memchr(key, '=', (size_t)(end - key));
		if (!val || (size_t)(val - key) != 6 || strncmp(key, "socket", 6) != 0 || u->socket)
			return bad_url();
		if ((rc = decode(val + 1, (size_t)(end - val - 1), &u->socket)) < 0)
			return rc;
		q = end;
	}
	if (*q != '\0')
		return bad_url();
	return 0;
}

/*
 * "//user[:password]@host[:port]/db[?socket=PATH]", each part
 * percent-decoded. host may be an IPv6 literal in brackets.
 */
int idem__my_url_parse(my_url *u, const char *t)
{
	const char *auth, *auth_end, *at = NULL, *path_end;
	int rc = 0;

	memset(u, 0, sizeof(*u));
	if (strncmp(t, "//", 2) != 0)
		goto bad;
	auth = t + 2;
	auth_end = auth + strcspn(auth, "/?#");
	if (*auth_end != '/')
		goto bad; /* the database is required */
	for (const char *p = auth; p < auth_end; p++)
		if (*p == '@')
			at = p; /* the last '@': an unescaped one in a password still works */
	if (!at || at == auth)
		goto bad; /* the user is required */
	if ((rc = parse_userinfo(u, auth, at)) < 0 ||
	    (rc = parse_hostport(u, at + 1, auth_end)) < 0)
		goto done;
	path_end = auth_end + 1 + strcspn(auth_end + 1, "?#");
	if (path_end == auth_end + 1 ||
	    memchr(auth_end + 1, '/', (size_t)(path_end - auth_end - 1)))
		goto bad;
	if ((rc = decode(auth_end + 1, (size_t)(path_end - auth_end - 1), &u->db)) < 0 ||
	    (rc = parse_options(u, path_end)) < 0)
		goto done;
	if (!*u->host && !u->socket)
		goto bad;
	goto done;
bad:
	rc = bad_url();
done:
	if (rc < 0)
		idem__my_url_clear(u);
	return rc;
}
