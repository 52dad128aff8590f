//! Builds the one C function the `mpi` feature needs beyond the `mpi`
//! crate: `MPI_IN_PLACE` is a cast macro (`((void *) 1)` in Open MPI) that
//! bindgen cannot export, so `src/mpi/shim.c`, compiled by the MPI's own
//! compiler wrapper, returns it. Without the feature this does nothing, so
//! the crate builds on machines without MPI.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The `cfg` keeps the optional `cc` build-dependency out of builds
    // without the feature; Cargo also says it through the environment.
    #[cfg(feature = "mpi")]
    if std::env::var_os("CARGO_FEATURE_MPI").is_some() {
        mpi_shim();
    }
}

#[cfg(feature = "mpi")]
fn mpi_shim() {
    println!("cargo:rerun-if-changed=src/mpi/shim.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    // The same compiler wrapper the `mpi` crate (mpi-sys) finds: `MPICC`,
    // else `mpicc` on PATH, so mpi.h comes from the MPI being linked.
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".into());
    cc::Build::new().compiler(mpicc).file("src/mpi/shim.c").warnings(true).compile("brasa_mpi_shim");
}
