# PGXS build of the idempotency extension (C++17, OpenSSL libcrypto).
EXTENSION = idempotency
MODULE_big = idempotency
DATA = idempotency--1.0.sql idempotency--1.0--1.1.sql idempotency--1.1--1.2.sql idempotency--1.2--1.3.sql idempotency--1.3--1.4.sql idempotency--1.4--1.5.sql \
       idempotency--1.2--1.4.sql

CORE_OBJS = src/core/key.o src/core/canonical_json.o src/core/sha256.o src/core/key_state.o src/core/outbox.o src/core/batch.o
# One folder per concern (src/pg/README.md): what they share, what the extension knows
# of Citus, the key store, messaging, the background worker, and the module that
# installs them into PostgreSQL.
PG_COMMON_OBJS = src/pg/common/errors.o src/pg/common/guc.o src/pg/common/key_type.o src/pg/common/open_relations.o src/pg/common/table.o src/pg/common/waits.o
PG_CITUS_OBJS = src/pg/citus/citus_meta.o src/pg/citus/citus_forward.o src/pg/citus/twin_privilege.o
PG_KEYS_OBJS = src/pg/keys/key_row.o src/pg/keys/store_catalog.o src/pg/keys/store.o src/pg/keys/store_scans.o src/pg/keys/identity_lock.o src/pg/keys/outcome_counters.o src/pg/keys/driver.o src/pg/keys/xact.o src/pg/keys/arguments.o src/pg/keys/api_claim.o src/pg/keys/api_finish.o src/pg/keys/api_read.o src/pg/keys/api_fingerprint.o src/pg/keys/error_hints.o
PG_MESSAGING_OBJS = src/pg/messaging/messaging_catalog.o src/pg/messaging/outbox_row.o src/pg/messaging/keyed_write.o src/pg/messaging/api_emit.o src/pg/messaging/api_apply.o src/pg/messaging/api_outbox.o
PG_WORKER_OBJS = src/pg/worker/worker_state.o src/pg/worker/launcher.o src/pg/worker/reaper.o src/pg/worker/reaper_pass.o src/pg/worker/api_reap.o src/pg/worker/api_monitor.o src/pg/worker/api_install.o
PG_MODULE_OBJS = src/pg/module/module.o src/pg/module/utility_hook.o src/pg/module/shmem.o
PG_OBJS = $(PG_COMMON_OBJS) $(PG_CITUS_OBJS) $(PG_KEYS_OBJS) $(PG_MESSAGING_OBJS) $(PG_WORKER_OBJS) $(PG_MODULE_OBJS)
OBJS = $(CORE_OBJS) $(PG_OBJS)

PG_CPPFLAGS = -Isrc
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-register
SHLIB_LINK = -lstdc++ -lcrypto
# The tests build with WERROR=1: a warning in the extension's own sources fails them,
# on every PostgreSQL version they build against.
ifdef WERROR
PG_CXXFLAGS += -Werror
endif

EXTRA_CLEAN = $(EXTENSION)-*.tar.gz tmp_check_regress tmp_check_iso

REGRESS = key_type claim unwritten own_window finish set_constraints lease abandoned fingerprint fingerprint_vectors identity lock_secret bad_input hostile layout settings reaper outbox apply_version open_relations two_phase ddl_rollback schemas messages routing once_many counters self_locked cost search_path
# Each runs against a temporary instance of its own (as postgres, not root), with
# the settings the tests need: `make installcheck` needs no running server.
REGRESS_OPTS = --inputdir=. --temp-instance=tmp_check_regress --temp-config=test/regress.conf

ISOLATION = claim_wait finish_wait once_race isolation_levels opposite_order lease_takeover reaper_wait emit_order emit_event_id relay_order apply_race index_descriptions deadlocks index_maintenance once_many_race subtransaction_cap messaging_cap
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=output_iso \
                 --temp-instance=tmp_check_iso --temp-config=test/regress.conf

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# No LLVM bitcode: JIT inlining of this module is not needed and would require clang.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Debian's PGXS tracks no header dependencies: rebuild every object when a header
# changes, so that no object keeps an old struct or column layout.
$(OBJS): $(wildcard src/core/*.hpp src/pg/*/*.hpp)

# The direct update path from 1.2 is made from idempotency--1.2--1.3.sql (its grants
# carried by signature) and idempotency--1.3--1.4.sql, never edited by hand; `make`
# remakes it when either changes, and test/run_all.sh checks the committed file is
# what this makes (scripts/update_scripts.sh says why).
all: idempotency--1.2--1.4.sql
idempotency--1.2--1.4.sql: idempotency--1.2--1.3.sql idempotency--1.3--1.4.sql idempotency--1.4--1.5.sql \
    scripts/update/1.2--1.3.grants_save.sql scripts/update/1.2--1.3.grants_restore.sql \
    scripts/update_scripts.sh
	scripts/update_scripts.sh

# make dist: a source tarball of the tracked files as they are in the work tree
# (uncommitted changes included), for PGXN and for building elsewhere. After the
# include, so that PGXS's `all` stays the default goal.
EXT_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)
DISTNAME = $(EXTENSION)-$(EXT_VERSION)

.PHONY: dist
dist:
	worktree=$$(git -c user.name=make-dist -c user.email=make-dist@localhost stash create) && \
	  git archive --format=tar.gz --prefix=$(DISTNAME)/ -o $(DISTNAME).tar.gz $${worktree:-HEAD}

# make installcheck-server: the regression tests against a running server instead of a
# temporary instance: the one libpq's environment names (PGHOST, PGPORT, PGUSER, a
# superuser), after `make install` there, in a database of their own (SERVER_TESTDB),
# dropped afterwards. A test needing a server-wide setting the server lacks is skipped
# with the reason (test/installcheck_server.sh says which and what it sets).
SERVER_TESTDB = idempotency_installcheck

.PHONY: installcheck-server
installcheck-server:
	PG_REGRESS='$(top_builddir)/src/test/regress/pg_regress' PG_BINDIR='$(bindir)' \
	  EXT_VERSION='$(EXT_VERSION)' SERVER_TESTDB='$(SERVER_TESTDB)' \
	  EXTRA_REGRESS_OPTS='$(EXTRA_REGRESS_OPTS)' test/installcheck_server.sh $(REGRESS)

# The developer loop: clang-format (.clang-format) and clang-tidy (.clang-tidy), over
# the C++ of both halves. `make lint` records the compiler's commands with bear, so
# compile_commands.json covers src/pg (with PostgreSQL's headers) as well as src/core.
CXX_SOURCES = $(wildcard src/core/*.cpp src/pg/*/*.cpp)
CXX_FILES = $(CXX_SOURCES) $(wildcard src/core/*.hpp src/pg/*/*.hpp test/unit/*.cpp test/fuzz/*.cpp)

.PHONY: format format-check lint layers-check search-path-check
format:
	clang-format -i $(CXX_FILES)
format-check:
	clang-format --dry-run --Werror $(CXX_FILES)
compile_commands.json: $(CXX_SOURCES)
	bear --output $@ -- $(MAKE) -B $(OBJS) PG_CONFIG=$(PG_CONFIG)
layers-check:
	test/check_layers.sh
# The SQL and PL/pgSQL functions without SET search_path qualify every operator,
# function, type, collation and relation (SPEC Security).
search-path-check:
	python3 test/check_search_path.py
lint: compile_commands.json
	clang-tidy -p . --quiet $(CXX_SOURCES)

# make sql-only: the SQL-only edition's two files under dist/ (sqlonly/README.md).
.PHONY: sql-only
sql-only:
	sqlonly/build.sh

# make relay: the relay program idem-relay (relay/README.md), built offline from
# Debian's Go packages; make relay-install installs it (DESTDIR, PREFIX as usual).
.PHONY: relay relay-install
relay:
	$(MAKE) -C relay
relay-install:
	$(MAKE) -C relay install
