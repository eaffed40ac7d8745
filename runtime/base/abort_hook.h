// abort_hook.h — how a fatal error ends the whole job.
//
// With several ranks, exiting one process leaves the others blocked in a collective; the
// communicator layer installs a hook (MPI_Abort on the world) so that a fatal error on any rank
// ends every rank. Without a hook, abort_job() flushes and exits the process.
//
// The hook is given a bounded time: MPI_Abort asks this host's launcher daemon (mpirun, orted) to
// end the job, and a daemon that does not answer — stopped, or itself waiting on a host the
// network no longer reaches — would hold this rank inside MPI_Abort for good. After grace_s
// seconds the rank ends by itself with the same status; the launcher, seeing a rank exit
// non-zero, ends the others as MPI_Abort would have.
#pragma once

namespace strata {

using AbortHook = void (*)(int status);

// Installs the job-wide abort (nullptr restores the default) and how long abort_job() waits for
// it before ending the process itself (grace_s <= 0: as long as the hook takes). Not thread-safe:
// call at start-up.
void set_abort_hook(AbortHook hook, double grace_s = 2.0);

// Ends the job with `status`: flushes stdout and stderr, runs the hook (bounded by its grace),
// then exits the process. Never returns. May be called from any thread.
[[noreturn]] void abort_job(int status);

}  // namespace strata
