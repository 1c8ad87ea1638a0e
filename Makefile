PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: install deb

# Release binaries, man pages and completions under $(DESTDIR)$(PREFIX).
install:
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" ./scripts/install.sh

# A Debian package in target/debian/ (dpkg-deb).
deb:
	./scripts/package-deb.sh
