/*
 * tests/fuzz/server_glue.h: the idemd routing code (src/server/routes.c,
 * compiled into the target as it is) on a request the harness builds from
 * fuzz bytes instead of a libmicrohttpd connection. Only the connection is
 * replaced: the routes, the authentication and the pay calls are the real ones.
 */
#ifndef IDEM_FUZZ_SERVER_GLUE_H
#define IDEM_FUZZ_SERVER_GLUE_H

#include <pthread.h>
#include <stddef.h>

#include "server/server.h"

#define GLUE_MAX_FIELDS 16

typedef struct {
	const char *name;
	const char *value; /* its bytes; may hold NUL */
	size_t len;        /* of value */
} glue_field;

struct http_req {
	glue_field headers[GLUE_MAX_FIELDS];
	int nheaders;
	glue_field query[GLUE_MAX_FIELDS];
	int nquery;
	const char *body;
	size_t body_len;
	/* the write in flight */
	idem_pay_request write;
	char key[IDEM_KEY_MAX + 2];
	char write_path[400];
	int done;
	http_answer later;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

/* The Idempotency-Key parser of routes.c (static there). */
int glue_parse_idem_key(const char *v, size_t vlen, char *out, size_t outsz, size_t *len);

/*
 * Route r as on_request does: route_prepare, route_check_media, the handler,
 * and the wait for a write's answer. The answer lands in *a (body owned).
 * Returns 1 when authentication passed (the handler ran), 0 otherwise.
 */
int glue_run(server_state *s, http_req *r, const char *method, const char *path, http_answer *a);

#endif
