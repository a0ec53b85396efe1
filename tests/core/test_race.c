/*
 * tests/core/test_race.c: many callers racing on the same keys. Counted by
 * the rows the unit of work writes: exactly one execution per key, and
 * every other caller a REPLAY of the same body. First within one process
 * (16 threads, 1,000 rounds), then across two processes on one database.
 *
 * This is the test that must fail if the claim is ever decided by a read
 * (SELECT-then-INSERT) instead of by the INSERT into the unique index.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

#define THREADS 16
#define ROUNDS  1000

typedef struct {
	idem_store *store;
	const char *scope;
	int rounds;
	int nthreads;
	pthread_barrier_t *barrier;
	char fp[65];
	/* per thread, per round: outcome, and the body answered */
	int (*outcome)[THREADS];
	char (*body)[THREADS][96];
	int errors;
} race;

typedef struct {
	race *r;
	int id;
	char key[32];
} worker;

static int work(idem_txn *txn, void *ctx, idem_response *resp)
{
	worker *w = ctx;
	char body[96];
	idem_value p[3] = {IDEM_V_TEXT(w->r->scope), IDEM_V_TEXT(w->key), IDEM_V_INT(w->id)};
	int rc = idem_txn_exec(txn, "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)", p,
	                       3, NULL);

	if (rc < 0)
		return rc;
	snprintf(body, sizeof(body), "{\"key\":\"%s\",\"by\":%d,\"pid\":%d}", w->key, w->id,
	         (int)getpid() % 1000);
	return idem_response_set(resp, 201, body, strlen(body));
}

static void *run_worker(void *arg)
{
	worker *w = arg;
	race *r = w->r;

	for (int round = 0; round < r->rounds; round++) {
		idem_request req = IDEM_REQUEST_INIT;
		idem_result res = {0};
		int rc;

		snprintf(w->key, sizeof(w->key), "key-%d", round);
		req.scope = r->scope;
		req.business_type = "payment";
		req.key = w->key;
		req.key_len = strlen(w->key);
		req.fingerprint = r->fp;
		pthread_barrier_wait(r->barrier);
		rc = idem_execute(&res, r->store, &req, work, w);
		if (rc != 0) {
			fprintf(stderr, "worker %d round %d: %d %s\n", w->id, round, rc,
			        idem_error_last()->message);
			__atomic_fetch_add(&r->errors, 1, __ATOMIC_RELAXED);
			r->outcome[round][w->id] = -1;
			continue;
		}
		r->outcome[round][w->id] = (int)res.outcome;
		snprintf(r->body[round][w->id], sizeof(r->body[round][w->id]), "%.*s",
		         (int)res.body_len, (const char *)res.body);
		idem_result_clear(&res);
	}
	return NULL;
}

/* Run nthreads racing workers for rounds rounds; returns FIRST count. */
static int run_race(race *r)
{
	pthread_t th[THREADS];
	worker w[THREADS];
	pthread_barrier_t barrier;
	int firsts = 0;

	pthread_barrier_init(&barrier, NULL, (unsigned)r->nthreads);
	r->barrier = &barrier;
	r->outcome = calloc((size_t)r->rounds, sizeof(*r->outcome));
	r->body = calloc((size_t)r->rounds, sizeof(*r->body));
	for (int i = 0; i < r->nthreads; i++) {
		w[i].r = r;
		w[i].id = i;
		pthread_create(&th[i], NULL, run_worker, &w[i]);
	}
	for (int i = 0; i < r->nthreads; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&barrier);

	/* Every caller of a round got the same body; one FIRST at most here. */
	for (int round = 0; round < r->rounds; round++) {
		int first_here = 0;

		for (int i = 0; i < r->nthreads; i++) {
			if (r->outcome[round][i] == IDEM_FIRST)
				first_here++;
			else if (r->outcome[round][i] != IDEM_REPLAY)
				fail_msg("round %d thread %d: outcome %d", round, i,
				         r->outcome[round][i]);
			if (strcmp(r->body[round][i], r->body[round][0]) != 0)
				fail_msg("round %d: thread %d got %s, thread 0 got %s", round, i,
				         r->body[round][i], r->body[round][0]);
		}
		if (first_here > 1)
			fail_msg("round %d: %d callers executed", round, first_here);
		firsts += first_here;
	}
	return firsts;
}

static void free_race(race *r)
{
	free(r->outcome);
	free(r->body);
}

/* Each key's work ran exactly once, and the record holds the body answered. */
static void check_db(idem_store *store, const char *scope, int rounds, race *r)
{
	for (int round = 0; round < rounds; round++) {
		char key[32];
		idem_record_info info;

		snprintf(key, sizeof(key), "key-%d", round);
		if (test_work_count(store, scope, key) != 1)
			fail_msg("%s executed %lld times", key,
			         (long long)test_work_count(store, scope, key));
		assert_int_equal(idem_record_get(&info, store, scope, "payment", key, strlen(key)),
		                 0);
		if (r && (info.body_len != strlen(r->body[round][0]) ||
		          memcmp(info.body, r->body[round][0], info.body_len) != 0))
			fail_msg("%s: stored body differs from the answered one", key);
		idem_record_info_clear(&info);
	}
}

static void threads_race_one_process(void **state)
{
	char *url = test_db_url();
	idem_store *store = test_store_open(url, NULL);
	char scope[40];
	race r = {0};

	(void)state;
	test_scope(scope);
	test_create_work_log(store);
	r.store = store;
	r.scope = scope;
	r.rounds = ROUNDS;
	r.nthreads = THREADS;
	test_fp(r.fp, "{\"amount\":1}");
	assert_int_equal(run_race(&r), ROUNDS);
	assert_int_equal(r.errors, 0);
	check_db(store, scope, ROUNDS, &r);
	free_race(&r);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

#define PROC_THREADS 8
#define PROC_ROUNDS  300

/* Child and parent both run this, each with its own store on the same file. */
static int race_in_process(const char *url, const char *scope, int go_fd)
{
	idem_store *store = test_store_open(url, NULL);
	race r = {0};
	char c;
	int firsts;

	r.store = store;
	r.scope = scope;
	r.rounds = PROC_ROUNDS;
	r.nthreads = PROC_THREADS;
	test_fp(r.fp, "{\"amount\":1}");
	if (go_fd >= 0 && read(go_fd, &c, 1) != 1) /* both start together */
		fail_msg("start signal lost");
	firsts = run_race(&r);
	assert_int_equal(r.errors, 0);
	check_db(store, scope, PROC_ROUNDS, &r);
	free_race(&r);
	idem_store_close(store);
	return firsts;
}

static void processes_race_one_file(void **state)
{
	char *url = test_db_url();
	idem_store *store = test_store_open(url, NULL);
	char scope[40];
	int go[2], counts[2], status = 0, child_firsts = -1, firsts;
	pid_t pid;

	(void)state;
	test_scope(scope);
	test_create_work_log(store);
	idem_store_close(store);
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(counts), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int n;

		close(go[1]);
		n = race_in_process(url, scope, go[0]);
		if (write(counts[1], &n, sizeof(n)) != (ssize_t)sizeof(n))
			_exit(3);
		_exit(0);
	}
	close(go[0]);
	/* The child opens its store first; the byte lets both race from here. */
	assert_int_equal(write(go[1], "g", 1), 1);
	firsts = race_in_process(url, scope, -1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(read(counts[0], &child_firsts, sizeof(child_firsts)),
	                 (ssize_t)sizeof(child_firsts));
	/* Across both processes every key executed exactly once. */
	assert_int_equal(firsts + child_firsts, PROC_ROUNDS);
	store = test_store_open(url, NULL);
	check_db(store, scope, PROC_ROUNDS, NULL);
	idem_store_close(store);
	close(go[1]);
	test_db_drop(url);
	free(url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(threads_race_one_process),
	    cmocka_unit_test(processes_race_one_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
