/*
 * bench/http1.c: one blocking HTTP/1.1 request on a fresh connection, for
 * set-up and checks outside the timed phases (balances before and after).
 * Only loopback targets; a response larger than the caller's buffer fails.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench.h"

int http_simple(const char *host, int port, const char *method, const char *path, const char *auth,
                char *body, size_t bodylen)
{
	struct sockaddr_in sa;
	struct timeval tv = {10, 0};
	char req[1024], buf[65536];
	size_t got = 0;
	int fd = -1, n, status = -1;
	const char *hend;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		goto done;
	n = snprintf(req, sizeof(req),
	             "%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s%s%sConnection: close\r\n\r\n", method,
	             path, host, port, auth ? "Authorization: Bearer " : "", auth ? auth : "",
	             auth ? "\r\n" : "");
	if (n < 0 || (size_t)n >= sizeof(req))
		goto done;
	if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		goto done;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
		goto done;
	for (;;) {
		ssize_t r;

		if (got == sizeof(buf) - 1)
			goto done;
		r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			goto done;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	buf[got] = '\0';
	if (got < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || !(hend = strstr(buf, "\r\n\r\n")))
		goto done;
	hend += 4;
	if ((size_t)(buf + got - hend) >= bodylen)
		goto done;
	memcpy(body, hend, (size_t)(buf + got - hend));
	body[buf + got - hend] = '\0';
	status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
done:
	if (fd >= 0)
		close(fd);
	return status;
}
