/*
 * pay/chanpool.c: the bounded pool that makes channel calls. A fixed number
 * of workers, each with its own curl handle (so connections to a channel
 * are kept alive and reused), take jobs from one queue with a hard limit: a
 * job that does not fit is refused at once (the caller answers 503), never
 * queued without bound and never given a thread of its own. A job runs
 * under the deadline of the request that submitted it (its queue wait
 * counts), never under an earlier job's. A handle starts its pool at the
 * first call that needs one (pay__pool_get); the shards of a router share
 * the router's.
 */
#include <pthread.h>
#include <stdlib.h>

#include "pay/channel.h"
#include "util/error.h"

struct pay__pool {
	pthread_mutex_t lock;
	pthread_cond_t work;
	pay__job *head, *tail;
	int depth, queue_max, stopping, nthreads;
	pthread_t *threads;
};

static void *worker_main(void *arg)
{
	pay__pool *p = arg;
	CURL *h = curl_easy_init();

	for (;;) {
		pay__job *job;

		pthread_mutex_lock(&p->lock);
		while (!p->head && !p->stopping)
			pthread_cond_wait(&p->work, &p->lock);
		if (!p->head) {
			pthread_mutex_unlock(&p->lock);
			break;
		}
		job = p->head;
		p->head = job->next;
		if (!p->head)
			p->tail = NULL;
		p->depth--;
		pthread_mutex_unlock(&p->lock);
		if (!h)
			h = curl_easy_init(); /* may still be NULL: the job answers unknown */
		/* The request's deadline bounds its store calls here too (the
		 * claim, the completion): run frees job, so it is taken first. */
		idem_deadline_adopt(job->deadline);
		job->run(job, h);
		idem_deadline_adopt(0);
	}
	if (h)
		curl_easy_cleanup(h);
	return NULL;
}

int pay__pool_start(pay__pool **out, int workers, int queue_max)
{
	pay__pool *p;

	*out = NULL;
	if (workers < 1 || workers > 1024 || queue_max < 1)
		return idem__error(IDEM_EINVAL, "channel pool: workers 1..1024, queue >= 1");
	if (!(p = calloc(1, sizeof(*p))) ||
	    !(p->threads = calloc((size_t)workers, sizeof(pthread_t)))) {
		free(p);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work, NULL);
	p->queue_max = queue_max;
	for (int i = 0; i < workers; i++) {
		if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0)
			break;
		p->nthreads++;
	}
	if (p->nthreads == 0) {
		pay__pool_stop(p);
		return idem__error(IDEM_ENOMEM, "cannot start channel workers");
	}
	*out = p;
	return 0;
}

int pay__pool_submit(pay__pool *p, pay__job *job)
{
	int rc = 0;

	job->next = NULL;
	job->deadline = idem_deadline_get(); /* the caller's request, carried over */
	pthread_mutex_lock(&p->lock);
	if (p->stopping || p->depth >= p->queue_max) {
		rc = IDEM_ERETRY;
	} else {
		if (p->tail)
			p->tail->next = job;
		else
			p->head = job;
		p->tail = job;
		p->depth++;
		pthread_cond_signal(&p->work);
	}
	pthread_mutex_unlock(&p->lock);
	return rc;
}

int pay__pool_depth(pay__pool *p)
{
	int n;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = p->depth;
	pthread_mutex_unlock(&p->lock);
	return n;
}

void pay__pool_stop(pay__pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopping = 1;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_cond_destroy(&p->work);
	pthread_mutex_destroy(&p->lock);
	free(p->threads);
	free(p);
}

pay__pool *pay__pool_get(idem_pay *pay)
{
	pay__pool *p;

	if (pay->router) /* one pool of channel workers for all shards */
		return pay__pool_get(pay->router);
	pthread_mutex_lock(&pay->pool_lock);
	if (!pay->pool &&
	    pay__pool_start(&pay->pool, pay->opts.channel_workers, pay->opts.channel_queue) < 0)
		pay->pool = NULL;
	p = pay->pool;
	pthread_mutex_unlock(&pay->pool_lock);
	return p;
}
