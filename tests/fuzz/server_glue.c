/*
 * tests/fuzz/server_glue.c: see server_glue.h. routes.c is included here so
 * its static parsers are reachable; the functions below stand in for the
 * libmicrohttpd side of src/server/http.c (header and query lookup, the
 * suspended write) and answer_problem / answer_result.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/routes.c"
#include "server_glue.h"

int glue_parse_idem_key(const char *v, size_t vlen, char *out, size_t outsz, size_t *len)
{
	return parse_idem_key(v, vlen, out, outsz, len);
}

static const char *found(const glue_field *f, size_t *len)
{
	if (len)
		*len = f->len;
	return f->value;
}

const char *req_header(http_req *r, const char *name, size_t *len)
{
	for (int i = 0; i < r->nheaders; i++)
		if (strcasecmp(r->headers[i].name, name) == 0)
			return found(&r->headers[i], len);
	return NULL;
}

const char *req_query(http_req *r, const char *name, size_t *len)
{
	/* GET arguments are case-sensitive in libmicrohttpd. */
	for (int i = 0; i < r->nquery; i++)
		if (strcmp(r->query[i].name, name) == 0)
			return found(&r->query[i], len);
	return NULL;
}

int req_header_count(http_req *r, const char *name)
{
	int n = 0;

	for (int i = 0; i < r->nheaders; i++)
		n += strcasecmp(r->headers[i].name, name) == 0;
	return n;
}

const char *req_body(http_req *r, size_t *len)
{
	*len = r->body_len;
	return r->body ? r->body : "";
}

idem_pay_request *req_write(http_req *r, char **key_buf, size_t *key_size, char **path_buf,
                            size_t *path_size)
{
	*key_buf = r->key;
	*key_size = sizeof(r->key);
	*path_buf = r->write_path;
	*path_size = sizeof(r->write_path);
	return &r->write;
}

void http_write_done(void *ctx, int rc, idem_result *res)
{
	http_req *r = ctx;

	answer_result(&r->later, rc, res);
	pthread_mutex_lock(&r->lock);
	r->done = 1;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

void answer_problem(http_answer *a, int status, const char *code, const char *detail)
{
	(void)code;
	(void)detail;
	free(a->body);
	a->body = NULL;
	a->len = 0;
	a->status = status;
}

void answer_result(http_answer *a, int rc, idem_result *res)
{
	if (rc < 0) {
		answer_problem(a, rc == IDEM_ENOMEM || rc == IDEM_EINVAL ? 500 : 503, "", "");
		idem_result_clear(res);
		return;
	}
	free(a->body);
	a->status = res->http_status;
	a->body = (char *)res->body;
	a->len = res->body_len;
	a->replayed = res->outcome == IDEM_REPLAY;
	res->body = NULL;
	res->body_len = 0;
	idem_result_clear(res);
}

int glue_run(server_state *s, http_req *r, const char *method, const char *path, http_answer *a)
{
	route_match m;

	memset(a, 0, sizeof(*a));
	if (route_prepare(s, r, method, path, &m, a) != 0)
		return 0;
	if (route_check_media(r, method, a) != 0)
		return 1;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	m.handler(s, r, &m, a);
	if (a->pending) {
		pthread_mutex_lock(&r->lock);
		while (!r->done)
			pthread_cond_wait(&r->cond, &r->lock);
		pthread_mutex_unlock(&r->lock);
		free(a->body);
		*a = r->later;
		memset(&r->later, 0, sizeof(r->later));
	}
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	return 1;
}
