/* MPI_IN_PLACE for Rust: the MPI standard defines it as a macro (Open MPI:
 * ((void *) 1), MPICH: ((void *) -1)) that bindgen cannot export, and the
 * `mpi` crate has no in-place collectives. Compiled with mpicc by build.rs,
 * so the value always matches the mpi.h of the MPI being linked. */
#include <mpi.h>

void *brasa_mpi_in_place(void) { return MPI_IN_PLACE; }
