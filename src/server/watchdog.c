/*
 * server/watchdog.c: the request deadline (slowloris, issue 16).
 * --connection-timeout is an idle timeout that every byte resets, so a
 * client dripping a byte at a time held a connection forever. The watchdog
 * gives each request a deadline instead: its head and body must be in
 * within --request-timeout of the connection's opening or its previous
 * answer, else the socket is shut down (libmicrohttpd then sees it closed
 * and closes the connection on its own thread). A request that is being
 * answered (its body is in), or whose key is being looked up on a worker,
 * is never cut. One conn_track per TCP connection, on a list the watchdog
 * thread walks every 200 ms; it never touches a request, only a socket.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server.h"

struct conn_track {
	conn_track *prev, *next;
	int fd;
	/*
	 * (since << 1) | reading: when the current request's clock started (ms,
	 * CLOCK_MONOTONIC) and whether its head or body is still arriving. One
	 * word, so that an event thread sets it without the list lock (three
	 * times per request) and the watchdog cuts only with a compare-and-swap
	 * from the very word it judged: a request whose body came in meanwhile
	 * has another word and is never cut.
	 */
	_Atomic uint64_t state;
	int cut; /* the watchdog's, under lock */
	/* A paused clock (track_pause): the event thread's alone. */
	int paused;
	uint64_t paused_since, paused_at;
};

struct watchdog {
	pthread_mutex_t lock; /* conns, and every conn_track's cut */
	pthread_cond_t wake;
	conn_track *conns;
	pthread_t thread;
	int started, stopping;
	int limit_s;
};

static uint64_t now_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

void track_set(conn_track *t, int reading)
{
	uint64_t w;

	if (!t)
		return;
	w = atomic_load(&t->state);
	if (reading && !(w & 1)) /* the clock starts now */
		atomic_store(&t->state, now_ms() << 1 | 1);
	else if (!reading && (w & 1))
		atomic_store(&t->state, w & ~(uint64_t)1);
}

/*
 * The request waits for a key lookup on a worker, its head in and its body
 * not read: its clock stops (the client cannot send while the connection
 * is suspended) and goes on after as if the wait had not been. If the
 * watchdog cut it just before, its word is not ours to change: the
 * connection is closing.
 */
void track_pause(conn_track *t)
{
	uint64_t w;

	if (!t || !((w = atomic_load(&t->state)) & 1))
		return;
	if (atomic_compare_exchange_strong(&t->state, &w, w & ~(uint64_t)1)) {
		t->paused = 1;
		t->paused_since = w >> 1;
		t->paused_at = now_ms();
	}
}

void track_unpause(conn_track *t)
{
	if (!t || !t->paused)
		return;
	t->paused = 0;
	atomic_store(&t->state, (t->paused_since + (now_ms() - t->paused_at)) << 1 | 1);
}

conn_track *watchdog_add(watchdog *w, int fd)
{
	conn_track *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->fd = fd;
	atomic_init(&t->state, now_ms() << 1 | 1);
	pthread_mutex_lock(&w->lock);
	t->next = w->conns;
	if (w->conns)
		w->conns->prev = t;
	w->conns = t;
	pthread_mutex_unlock(&w->lock);
	return t;
}

void watchdog_remove(watchdog *w, conn_track *t)
{
	/* Called before libmicrohttpd closes the fd: once t is off the list
	 * under the lock, the watchdog can no longer touch that fd. */
	pthread_mutex_lock(&w->lock);
	if (t->prev)
		t->prev->next = t->next;
	else
		w->conns = t->next;
	if (t->next)
		t->next->prev = t->prev;
	pthread_mutex_unlock(&w->lock);
	free(t);
}

static void *watchdog_main(void *arg)
{
	watchdog *w = arg;
	uint64_t limit = (uint64_t)w->limit_s * 1000u;

	pthread_mutex_lock(&w->lock);
	while (!w->stopping) {
		struct timespec until;
		unsigned long cut = 0;
		uint64_t now = now_ms();

		for (conn_track *t = w->conns; t; t = t->next) {
			uint64_t s = atomic_load(&t->state);

			/* since may be a moment after now (set since now was read) */
			if ((s & 1) && !t->cut && now > (s >> 1) && now - (s >> 1) > limit &&
			    atomic_compare_exchange_strong(&t->state, &s, s & ~(uint64_t)1)) {
				shutdown(t->fd, SHUT_RDWR);
				t->cut = 1;
				cut++;
			}
		}
		if (cut)
			log_msg("warn", "http: %lu connection(s) past --request-timeout %ds closed",
			        cut, w->limit_s);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 200 * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&w->wake, &w->lock, &until);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int watchdog_start(watchdog **out, int request_timeout_s)
{
	watchdog *w = calloc(1, sizeof(*w));

	*out = NULL;
	if (!w)
		return -1;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	w->limit_s = request_timeout_s;
	if (pthread_create(&w->thread, NULL, watchdog_main, w) == 0)
		w->started = 1;
	else
		log_msg("warn", "http: no request deadline (cannot start the watchdog thread)");
	*out = w;
	return 0;
}

void watchdog_stop(watchdog *w)
{
	if (!w)
		return;
	if (w->started) {
		pthread_mutex_lock(&w->lock);
		w->stopping = 1;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
	}
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
	free(w);
}
