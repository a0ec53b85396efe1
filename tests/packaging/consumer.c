/*
 * tests/packaging/consumer.c: a program outside the project, built against
 * the installed libidem with `pkg-config --cflags --libs idem` and only the
 * public header. Opens a SQLite store at argv[1], executes one request, then
 * the same request again, which must be a replay of the stored answer.
 * Exit 0 on success; prints what went wrong otherwise.
 */
#include <idem/idem.h>
#include <stdio.h>
#include <string.h>

static int work(idem_txn *txn, void *ctx, idem_response *resp)
{
	int *runs = ctx;

	(void)txn;
	(*runs)++;
	return idem_response_set(resp, 201, "{\"id\":\"p1\"}", 11);
}

int main(int argc, char **argv)
{
	idem_store *store = NULL;
	idem_result r1 = {0}, r2 = {0};
	idem_request req = IDEM_REQUEST_INIT;
	char fp[65], url[4096];
	int rc, runs = 0, ok = 1;

	if (argc != 2) {
		fprintf(stderr, "usage: consumer DB_FILE\n");
		return 2;
	}
	if ((size_t)snprintf(url, sizeof(url), "sqlite:%s", argv[1]) >= sizeof(url))
		goto done;
	if ((rc = idem_store_open(&store, url, NULL)) < 0) {
		fprintf(stderr, "consumer: open: %s\n", idem_strerror(rc));
		goto done;
	}
	if ((rc = idem_store_migrate(store, NULL)) < 0) {
		fprintf(stderr, "consumer: migrate: %s\n", idem_strerror(rc));
		goto done;
	}
	if ((rc = idem_fingerprint(fp, "POST", "/v1/payments", "{\"amount\":1}", 12)) < 0)
		goto done;
	req.scope = "m_consumer";
	req.business_type = "payment";
	req.key = "key-1";
	req.key_len = 5;
	req.fingerprint = fp;
	if ((rc = idem_execute(&r1, store, &req, work, &runs)) < 0 ||
	    (rc = idem_execute(&r2, store, &req, work, &runs)) < 0) {
		fprintf(stderr, "consumer: execute: %s\n", idem_strerror(rc));
		goto done;
	}
	printf("first: %s %d, second: %s %d %.*s, work ran %d time(s)\n",
	       idem_outcome_name(r1.outcome), r1.http_status, idem_outcome_name(r2.outcome),
	       r2.http_status, (int)r2.body_len, (const char *)r2.body, runs);
	ok = !(r1.outcome == IDEM_FIRST && r2.outcome == IDEM_REPLAY && r2.http_status == 201 &&
	       r2.body_len == 11 && memcmp(r2.body, "{\"id\":\"p1\"}", 11) == 0 && runs == 1);
done:
	idem_result_clear(&r1);
	idem_result_clear(&r2);
	idem_store_close(store);
	return ok;
}
