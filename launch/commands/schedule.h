// commands/schedule.h — `strata schedule`: print a pipeline schedule as a diagram and simulate it.
//
//   strata schedule --schedule S --stages p --microbatches m [--chunks v] [--batches n]
//                   [--trace OUT.json] [--list] [--help]
//
// Prints one row per stage with its forwards and backwards laid out on a time axis simulated
// with equal op times (schedules/simulator.h), the simulated bubble beside the schedule's
// closed form, and the peak in-flight activations per stage; --trace writes the simulated
// timeline as a Chrome trace, --list the full instruction lists with their transfers.
//
// Thread-safety: one call at a time (writes stdout).
#pragma once

#include <string>
#include <vector>

namespace strata {

// Runs the command on its arguments (those after "schedule"); returns the exit status.
// Throws InputError("<command line>", flag, expected) for bad arguments.
int cmd_schedule(const std::vector<std::string>& args);

}  // namespace strata
