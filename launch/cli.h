// cli.h — the `strata` command line: subcommands, flags, help texts, exit statuses.
//
// Exit status: 0 success; 2 bad input (usage, config, data, checkpoint), with one line
// `error: <file>: <json.path or byte offset>: <what was expected>`; 1 any other failure, with
// the rank and the operation that failed.
#pragma once

namespace strata {

// Runs the command line; returns the process exit status.
int run_cli(int argc, char** argv);

}  // namespace strata
