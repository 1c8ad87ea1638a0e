/* The kernel side of the files benchmark: N directories of M files of
 * SIZE bytes each (distinct contents), then syncfs. Usage:
 *   mkfiles ROOT DIRS FILES_PER_DIR SIZE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s ROOT DIRS FILES_PER_DIR SIZE\n", argv[0]);
		return 2;
	}
	const char *root = argv[1];
	int dirs = atoi(argv[2]), files = atoi(argv[3]);
	size_t size = (size_t)atol(argv[4]);
	char *buf = malloc(size ? size : 1);
	char path[4096];
	if (!buf)
		return 1;
	for (int d = 0; d < dirs; d++) {
		snprintf(path, sizeof(path), "%s/d%02d", root, d);
		if (mkdir(path, 0755)) {
			perror(path);
			return 1;
		}
		for (int f = 0; f < files; f++) {
			snprintf(path, sizeof(path), "%s/d%02d/f%05d", root, d, f);
			int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
			if (fd < 0) {
				perror(path);
				return 1;
			}
			/* Distinct content per file: its number, then a pattern. */
			for (size_t i = 0; i < size; i++)
				buf[i] = (char)(i * 31 + f * 7 + d);
			snprintf(buf, size, "file %d/%d\n", d, f);
			if (write(fd, buf, size) != (ssize_t)size) {
				perror(path);
				return 1;
			}
			close(fd);
		}
	}
	int rfd = open(root, O_RDONLY);
	if (rfd < 0 || syncfs(rfd)) {
		perror("syncfs");
		return 1;
	}
	close(rfd);
	return 0;
}
