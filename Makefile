# PGXS build of the idempotency extension (C++17, OpenSSL libcrypto).
EXTENSION = idempotency
MODULE_big = idempotency
DATA = idempotency--1.0.sql idempotency--1.0--1.1.sql

CORE_OBJS = src/core/key.o src/core/canonical_json.o src/core/sha256.o src/core/decision.o
PG_OBJS = src/pg/errors.o src/pg/module.o src/pg/guc.o src/pg/key_type.o src/pg/hashing.o \
          src/pg/store.o src/pg/identity_lock.o src/pg/xact.o src/pg/worker.o src/pg/sql_api.o src/pg/monitor.o
OBJS = $(CORE_OBJS) $(PG_OBJS)

PG_CPPFLAGS = -Isrc
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-register
SHLIB_LINK = -lstdc++ -lcrypto

EXTRA_CLEAN = $(EXTENSION)-*.tar.gz

REGRESS = key_type claim unwritten finish lease abandoned fingerprint identity lock_secret bad_input hostile layout settings reaper
REGRESS_OPTS = --inputdir=.

ISOLATION = claim_wait finish_wait once_race isolation_levels opposite_order lease_takeover reaper_wait
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=output_iso

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# No LLVM bitcode: JIT inlining of this module is not needed and would require clang.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Debian's PGXS tracks no header dependencies: rebuild every object when a header
# changes, so that no object keeps an old struct or column layout.
$(OBJS): $(wildcard src/core/*.hpp src/pg/*.hpp)

# make dist: a source tarball of the tracked files as they are in the work tree
# (uncommitted changes included), for PGXN and for building elsewhere. After the
# include, so that PGXS's `all` stays the default goal.
EXT_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)
DISTNAME = $(EXTENSION)-$(EXT_VERSION)

.PHONY: dist
dist:
	worktree=$$(git -c user.name=make-dist -c user.email=make-dist@localhost stash create) && \
	  git archive --format=tar.gz --prefix=$(DISTNAME)/ -o $(DISTNAME).tar.gz $${worktree:-HEAD}
