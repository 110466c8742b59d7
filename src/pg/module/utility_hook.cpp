// The utility hook. First, it closes the relations the library keeps open for the
// transaction: TRUNCATE, ALTER TABLE, DROP and the like refuse a table this session
// has open. Then, with the preloaded library: DROP DATABASE, ALTER DATABASE ...
// RENAME or SET TABLESPACE and CREATE DATABASE ... TEMPLATE need the database to
// themselves, and only autovacuum workers are asked to leave by PostgreSQL; so the
// hook pauses the database (no new reaper) and stops its reaper first, once the
// command's permission checks would pass.
#include "pg/common/compat.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/worker/worker.hpp"
#include "pg/worker/worker_state.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/tablespace.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"
}

namespace idempotency {

static ProcessUtility_hook_type previous_process_utility;

// What a command that needs a database to itself does with it.
enum class Use { kDrop, kRename, kMove, kCopy };

// The string value of option `name`, or null.
static const char* option_string(List* options, const char* name) {
  ListCell* cell;
  foreach (cell, options) {
    DefElem* option = lfirst_node(DefElem, cell);
    if (strcmp(option->defname, name) == 0 && option->arg != nullptr) return defGetString(option);
  }
  return nullptr;
}

// Whether the command passes the checks dbcommands.c makes before it waits for the
// database's sessions to leave. `argument`: the new name, the tablespace, or the new
// database's name for kCopy.
static bool command_will_wait(Form_pg_database database, Use use, const char* argument) {
  Oid user = GetUserId();
  bool owner = has_privs_of_role(user, database->datdba);  // true for a superuser
  switch (use) {
    case Use::kDrop: return owner;
    case Use::kRename:
      return owner && have_createdb_privilege() && !OidIsValid(get_database_oid(argument, true));
    case Use::kMove: {
      Oid tablespace = get_tablespace_oid(argument, true);
      return owner && OidIsValid(tablespace) && tablespace != database->dattablespace &&
             compat::may_create_in_tablespace(tablespace, user);
    }
    case Use::kCopy:
      return have_createdb_privilege() && (database->datistemplate || owner) &&
             !OidIsValid(get_database_oid(argument, true));
  }
  return false;
}

// The database a DROP, RENAME, SET TABLESPACE or CREATE ... TEMPLATE needs alone, if
// the command will get as far as waiting for it. Any other statement, and one that
// will fail a permission check, leaves the worker alone: an unprivileged role
// looping one must not stop the reaper.
static Oid database_needed_alone(Node* statement) {
  const char* name = nullptr;
  const char* argument = nullptr;
  Use use = Use::kDrop;
  switch (nodeTag(statement)) {
    case T_DropdbStmt: name = castNode(DropdbStmt, statement)->dbname; break;
    case T_AlterDatabaseStmt: {
      AlterDatabaseStmt* alter = castNode(AlterDatabaseStmt, statement);
      argument = option_string(alter->options, "tablespace");
      if (argument != nullptr) name = alter->dbname;  // no other option needs it alone
      use = Use::kMove;
      break;
    }
    case T_RenameStmt: {
      RenameStmt* rename = castNode(RenameStmt, statement);
      if (rename->renameType == OBJECT_DATABASE) name = rename->subname;
      argument = rename->newname;
      use = Use::kRename;
      break;
    }
    case T_CreatedbStmt: {
      CreatedbStmt* create = castNode(CreatedbStmt, statement);
      name = option_string(create->options, "template");
      argument = create->dbname;
      use = Use::kCopy;
      break;
    }
    default: break;
  }
  Oid database = name == nullptr ? InvalidOid : get_database_oid(name, true);
  // On the current database each of these commands fails: this session is in it.
  if (!OidIsValid(database) || database == MyDatabaseId) return InvalidOid;
  HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(database));
  if (!HeapTupleIsValid(tuple)) return InvalidOid;
  bool waits =
      command_will_wait(reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple)), use, argument);
  ReleaseSysCache(tuple);
  return waits ? database : InvalidOid;
}

static void run_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                        ProcessUtilityContext context, ParamListInfo params,
                        QueryEnvironment* environment, DestReceiver* destination,
                        QueryCompletion* completion) {
  if (previous_process_utility)
    previous_process_utility(statement, query, read_only_tree, context, params, environment,
                             destination, completion);
  else
    standard_ProcessUtility(statement, query, read_only_tree, context, params, environment,
                            destination, completion);
}

static void process_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                            ProcessUtilityContext context, ParamListInfo params,
                            QueryEnvironment* environment, DestReceiver* destination,
                            QueryCompletion* completion) {
  close_transaction_relations();
  Oid database = worker_state_ready() ? database_needed_alone(statement->utilityStmt) : InvalidOid;
  // One pause per session: a nested command (PostgreSQL's own have none) runs under
  // the outer one's.
  if (!OidIsValid(database) || OidIsValid(own_pause())) {
    run_utility(statement, query, read_only_tree, context, params, environment, destination,
                completion);
    return;
  }
  pause_database(database);
  // Not PG_FINALLY: a FATAL exit (pg_terminate_backend while the command waits for
  // the database's sessions) skips it and would leave the database paused for good.
  PG_ENSURE_ERROR_CLEANUP(unpause_database, 0);
  {
    run_utility(statement, query, read_only_tree, context, params, environment, destination,
                completion);
  }
  PG_END_ENSURE_ERROR_CLEANUP(unpause_database, 0);
  unpause_database(0, 0);
}

void install_utility_hook() {
  previous_process_utility = ProcessUtility_hook;
  ProcessUtility_hook = [](PlannedStmt* statement, const char* query, bool read_only_tree,
                           ProcessUtilityContext context, ParamListInfo params,
                           QueryEnvironment* environment, DestReceiver* destination,
                           QueryCompletion* completion) {
    guarded([&] {
      process_utility(statement, query, read_only_tree, context, params, environment, destination,
                      completion);
    });
  };
}

}  // namespace idempotency
