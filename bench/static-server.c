/*
 * bench/static-server.c: the ceiling for idemd's replay path. libmicrohttpd
 * with the daemon options idemd uses (MHD_USE_AUTO_INTERNAL_THREAD, a thread
 * pool, the same connection limits), reading each request body and
 * answering every request with one fixed JSON body the size of a payment.
 * No parsing, no auth, no store: whatever idemd costs above this is idemd.
 * --thread-per-connection runs libmicrohttpd the way idemd does since issue
 * 13 (a thread per connection, poll), so that the price of that choice can
 * be told apart from idemd's own work (docs/benchmarks.md).
 *
 *   static-server --listen 127.0.0.1:PORT [--threads N | --thread-per-connection]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static const char body[] =
    "{\"id\":\"pay_static0000000000000000\",\"object\":\"payment\","
    "\"merchant_order_no\":\"Pstatic-0\",\"amount\":1000,\"currency\":\"CNY\","
    "\"channel\":\"bench\",\"status\":\"processing\",\"refunded_amount\":0,"
    "\"created_at\":\"2026-01-01T00:00:00Z\",\"updated_at\":\"2026-01-01T00:00:00Z\"}";

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
	static int marker;
	struct MHD_Response *resp;
	enum MHD_Result ret;

	(void)cls;
	(void)url;
	(void)method;
	(void)version;
	(void)upload;
	if (*con_cls == NULL) {
		*con_cls = &marker; /* headers seen; the body follows */
		return MHD_YES;
	}
	if (*upload_size) {
		*upload_size = 0; /* consumed */
		return MHD_YES;
	}
	resp =
	    MHD_create_response_from_buffer(sizeof(body) - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", "application/json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa;
	struct MHD_Daemon *d;
	const char *listen = "127.0.0.1:8081", *colon;
	char host[64];
	long threads = 8, port;
	sigset_t sigs;
	int sig = 0, per_conn = 0;

	for (int i = 1; i < argc; i++) {
		char *end = NULL;

		if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
			listen = argv[++i];
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			errno = 0;
			threads = strtol(argv[++i], &end, 10);
			if (errno || *end || threads < 1 || threads > 256) {
				fprintf(stderr, "static-server: bad --threads\n");
				return 2;
			}
		} else if (strcmp(argv[i], "--thread-per-connection") == 0) {
			per_conn = 1;
		} else {
			fprintf(stderr, "usage: static-server --listen HOST:PORT [--threads N | "
			                "--thread-per-connection]\n");
			return 2;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	if (!(colon = strrchr(listen, ':')) || (size_t)(colon - listen) >= sizeof(host)) {
		fprintf(stderr, "static-server: bad --listen\n");
		return 2;
	}
	snprintf(host, sizeof(host), "%.*s", (int)(colon - listen), listen);
	errno = 0;
	port = strtol(colon + 1, NULL, 10);
	if (errno || port < 1 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "static-server: bad --listen\n");
		return 2;
	}
	sa.sin_port = htons((uint16_t)port);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (per_conn) /* idemd's flags and stack size (src/server/http.c) */
		d = MHD_start_daemon(
		    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
		        MHD_USE_ITC | MHD_USE_ERROR_LOG,
		    0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
		    MHD_OPTION_THREAD_STACK_SIZE, (size_t)1024 * 1024, MHD_OPTION_CONNECTION_LIMIT,
		    1024u, MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		    (size_t)64 * 1024, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
	else
		d = MHD_start_daemon(
		    MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL,
		    on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
		    MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads, MHD_OPTION_CONNECTION_LIMIT,
		    1024u, MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
		    (size_t)64 * 1024, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "static-server: cannot listen on %s\n", listen);
		return 1;
	}
	if (per_conn)
		fprintf(stderr, "static-server: listening on %s, a thread per connection\n",
		        listen);
	else
		fprintf(stderr, "static-server: listening on %s, %ld threads\n", listen, threads);
	sigwait(&sigs, &sig);
	MHD_stop_daemon(d);
	return 0;
}
