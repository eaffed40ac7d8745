// abort_hook.h — how a fatal error ends the whole job.
//
// With several ranks, exiting one process leaves the others blocked in a collective; the
// communicator layer installs a hook (MPI_Abort on the world) so that a fatal error on any rank
// ends every rank. Without a hook, abort_job() flushes and exits the process.
#pragma once

namespace strata {

using AbortHook = void (*)(int status);

// Installs the job-wide abort (nullptr restores the default). Not thread-safe: call at start-up.
void set_abort_hook(AbortHook hook);

// Ends the job with `status`. Never returns.
[[noreturn]] void abort_job(int status);

}  // namespace strata
