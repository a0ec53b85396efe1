/*
 * tests/fault/iofault.c: an LD_PRELOAD shim that makes fsync, fdatasync,
 * write, pwrite (and pwrite64) fail on chosen files, for the injected I/O
 * fault tests (test_iofault.py). Nothing is mocked: the real call runs
 * unless a fault is due.
 *
 *   IDEM_IOFAULT_MATCH  only files whose path contains this string
 *                       (the database directory) ever fail
 *   IDEM_IOFAULT_CTL    a control file, re-read at most every 20 ms:
 *                         "off"  or  "<EIO|ENOSPC> <ops> <percent>"
 *                       ops: a comma list of fsync, fdatasync, write, pwrite
 *   IDEM_IOFAULT_COUNT  a file the shim keeps the number of faults in
 *
 * A failing write writes nothing (as a full disk does before the first
 * byte); a failing fsync returns the error after doing nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { OP_FSYNC = 1, OP_FDATASYNC = 2, OP_WRITE = 4, OP_PWRITE = 8 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int mode_errno, mode_ops, mode_percent;
static struct timespec last_read;
static atomic_long faults;
static unsigned int seed = 12345;

static void read_ctl(void)
{
	const char *path = getenv("IDEM_IOFAULT_CTL");
	char buf[128] = "", name[16] = "", ops[64] = "";
	struct timespec now;
	int fd, percent = 0;
	ssize_t n;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if ((now.tv_sec - last_read.tv_sec) * 1000 + (now.tv_nsec - last_read.tv_nsec) / 1000000 <
	    20)
		return;
	last_read = now;
	mode_ops = 0;
	if (!path || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	if (sscanf(buf, "%15s %63s %d", name, ops, &percent) != 3)
		return; /* "off" */
	mode_errno = strcmp(name, "ENOSPC") == 0 ? ENOSPC : EIO;
	mode_percent = percent;
	for (char *t = ops; *t;) {
		size_t len = strcspn(t, ",");
		static const struct {
			const char *name;
			int op;
		} names[] = {{"fsync", OP_FSYNC},
		             {"fdatasync", OP_FDATASYNC},
		             {"write", OP_WRITE},
		             {"pwrite", OP_PWRITE}};

		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (strlen(names[i].name) == len && strncmp(t, names[i].name, len) == 0)
				mode_ops |= names[i].op;
		t += len;
		if (*t == ',')
			t++;
	}
}

static int matches(int fd)
{
	const char *match = getenv("IDEM_IOFAULT_MATCH");
	char link[64], path[4096];
	ssize_t n;

	if (!match || !*match || fd < 0)
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if ((n = readlink(link, path, sizeof(path) - 1)) <= 0)
		return 0;
	path[n] = '\0';
	return strstr(path, match) != NULL;
}

static void count(void)
{
	const char *path = getenv("IDEM_IOFAULT_COUNT");
	char buf[32];
	long n = atomic_fetch_add(&faults, 1) + 1;
	int fd, len;

	if (!path || (fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return;
	len = snprintf(buf, sizeof(buf), "%ld\n", n);
	/* the raw system call: never back through this shim */
	(void)syscall(SYS_pwrite64, fd, buf, (size_t)len, (off_t)0);
	close(fd);
}

/* Should this call on fd fail? Then errno is set. */
static int due(int op, int fd)
{
	int hit = 0;

	if (!getenv("IDEM_IOFAULT_CTL"))
		return 0;
	pthread_mutex_lock(&lock);
	read_ctl();
	if ((mode_ops & op) && (int)(rand_r(&seed) % 100) < mode_percent)
		hit = 1;
	pthread_mutex_unlock(&lock);
	if (!hit || !matches(fd))
		return 0;
	count();
	return 1;
}

typedef int (*sync_fn)(int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

/* The next definition of name (libc's), looked up once. */
static void *real(void **slot, const char *name)
{
	if (!*slot)
		*slot = dlsym(RTLD_NEXT, name);
	return *slot;
}

static void *real_fsync, *real_fdatasync, *real_write, *real_pwrite, *real_pwrite64;

int fsync(int fd)
{
	sync_fn f = (sync_fn)real(&real_fsync, "fsync");

	if (due(OP_FSYNC, fd)) {
		errno = mode_errno;
		return -1;
	}
	return f(fd);
}

int fdatasync(int fd)
{
	sync_fn f = (sync_fn)real(&real_fdatasync, "fdatasync");

	if (due(OP_FDATASYNC, fd)) {
		errno = mode_errno;
		return -1;
	}
	return f(fd);
}

ssize_t write(int fd, const void *buf, size_t n)
{
	write_fn f = (write_fn)real(&real_write, "write");

	if (due(OP_WRITE, fd)) {
		errno = mode_errno;
		return -1;
	}
	return f(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	pwrite_fn f = (pwrite_fn)real(&real_pwrite, "pwrite");

	if (due(OP_PWRITE, fd)) {
		errno = mode_errno;
		return -1;
	}
	return f(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	pwrite_fn f = (pwrite_fn)real(&real_pwrite64, "pwrite64");

	if (due(OP_PWRITE, fd)) {
		errno = mode_errno;
		return -1;
	}
	return f(fd, buf, n, off);
}
