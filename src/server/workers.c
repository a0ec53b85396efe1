/*
 * server/workers.c: the threads that do what may wait for idemd's HTTP
 * event threads, which must never wait (http.c): a key lookup the cache
 * cannot answer, a store read, /healthz's ping, the start of a write (its
 * read before the write). Not a small fixed pool: a request that waits
 * for a frozen store up to its deadline must hold only its own thread, as
 * it did with a thread per connection (docs/reliability.md). So an item
 * goes to an idle worker when there is one, else to a new thread, up to
 * max at once (--max-connections: each connection has at most one item in
 * flight, so an item never waits behind another one's wait); a worker
 * idle for idle_ms exits. Nothing here knows HTTP; it never waits but on
 * its own lock, and never frees an item (run may).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "server/server.h"

typedef struct worker {
	struct worker *next;
	pthread_t tid;
	workers *pool;
} worker;

/*
 * Under lock: the queue, the counts, and both lists. A worker is on
 * running from its start until it leaves on its own (then on exited, to be
 * joined by another worker or by workers_stop) or until workers_stop,
 * which takes both lists once stopping is set and joins every thread on
 * them; a worker never touches the lists once stopping is set, so each
 * thread is joined exactly once and nothing of the pool is used after.
 */
struct workers {
	pthread_mutex_t lock;
	pthread_cond_t wake; /* idle workers wait here, CLOCK_MONOTONIC */
	work_item *head, *tail;
	int queued; /* items on the queue, not yet taken */
	int idle;   /* workers waiting on wake */
	int live;   /* workers started, not yet gone */
	int max, idle_ms, stopping;
	worker *running, *exited;
	pthread_attr_t attr;
};

static void unlink_worker(worker **list, worker *w)
{
	for (; *list; list = &(*list)->next)
		if (*list == w) {
			*list = w->next;
			return;
		}
}

/* Join the workers that left on their own (they are past their last lock). */
static void reap(workers *p)
{
	worker *w, *next;

	pthread_mutex_lock(&p->lock);
	w = p->stopping ? NULL : p->exited;
	if (w)
		p->exited = NULL;
	pthread_mutex_unlock(&p->lock);
	for (; w; w = next) {
		next = w->next;
		pthread_join(w->tid, NULL);
		free(w);
	}
}

static struct timespec idle_until(const workers *p)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_sec += p->idle_ms / 1000;
	t.tv_nsec += (long)(p->idle_ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/*
 * Take items until there is none for idle_ms. A signalled worker and one
 * whose wait timed out at the same moment both look at the queue first,
 * so no signal is lost; the count of idle workers includes one that was
 * signalled and has not woken yet, so a submit that finds more items than
 * idle workers starts a thread rather than count on it twice.
 */
static void *worker_main(void *arg)
{
	worker *self = arg;
	workers *p = self->pool;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		work_item *it = p->head;
		struct timespec until;
		int rc = 0;

		if (it) {
			if (!(p->head = it->next))
				p->tail = NULL;
			p->queued--;
			pthread_mutex_unlock(&p->lock);
			it->run(it); /* it may be gone now */
			reap(p);
			pthread_mutex_lock(&p->lock);
			continue;
		}
		if (p->stopping)
			break;
		until = idle_until(p);
		p->idle++;
		while (!p->head && !p->stopping && rc != ETIMEDOUT)
			rc = pthread_cond_timedwait(&p->wake, &p->lock, &until);
		p->idle--;
		if (!p->head && !p->stopping && rc == ETIMEDOUT) {
			unlink_worker(&p->running, self);
			self->next = p->exited;
			p->exited = self;
			break;
		}
	}
	p->live--;
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int workers_start(workers **out, int max, size_t stack_size, int idle_ms)
{
	workers *p = calloc(1, sizeof(*p));
	pthread_condattr_t ca;

	*out = NULL;
	if (!p)
		return -1;
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->wake, &ca);
	pthread_condattr_destroy(&ca);
	pthread_attr_init(&p->attr);
	pthread_attr_setstacksize(&p->attr, stack_size);
	p->max = max > 0 ? max : 1;
	p->idle_ms = idle_ms > 0 ? idle_ms : 1;
	*out = p;
	return 0;
}

/* Under p->lock: one more thread, which takes from the queue. 0 or -1. */
static int start_worker(workers *p)
{
	worker *w = calloc(1, sizeof(*w));

	if (!w)
		return -1;
	w->pool = p;
	if (pthread_create(&w->tid, &p->attr, worker_main, w) != 0) {
		free(w);
		return -1;
	}
	w->next = p->running;
	p->running = w;
	p->live++;
	return 0;
}

int workers_submit(workers *p, work_item *item)
{
	int rc = 0;

	pthread_mutex_lock(&p->lock);
	if (p->stopping) {
		pthread_mutex_unlock(&p->lock);
		return -1;
	}
	item->next = NULL;
	if (p->tail)
		p->tail->next = item;
	else
		p->head = item;
	p->tail = item;
	p->queued++;
	if (p->queued <= p->idle)
		pthread_cond_signal(&p->wake);
	else if (p->live < p->max && start_worker(p) < 0 && p->live == 0) {
		/* No thread for it, and none will come for it. A worker leaves
		 * only with the queue empty, so with none left item is all it holds. */
		p->head = p->tail = NULL;
		p->queued = 0;
		rc = -1;
	}
	/* else: every worker is busy and max are running; the first free takes it */
	pthread_mutex_unlock(&p->lock);
	return rc;
}

void workers_stop(workers *p)
{
	worker *lists[2], *w, *next;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopping = 1;
	pthread_cond_broadcast(&p->wake);
	lists[0] = p->running;
	lists[1] = p->exited;
	p->running = p->exited = NULL;
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < 2; i++)
		for (w = lists[i]; w; w = next) {
			next = w->next;
			pthread_join(w->tid, NULL);
			free(w);
		}
	pthread_attr_destroy(&p->attr);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
