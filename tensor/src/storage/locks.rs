//! Several storages locked for one operation: each distinct storage once,
//! in address order (so two threads can never wait on each other), for
//! writing if the operation writes it. [`StorageLocks`] hands out `&[T]` for
//! any of them and `&mut [T]` for one written storage next to `&[U]` for the
//! others; a storage both read and written is locked once, for writing, and
//! read through its `&mut [T]`.

use super::Storage;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// The lock held on one storage (kept only to be released on drop).
enum Lock<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// One storage and the lock held on it.
pub(super) struct Held<'a> {
    pub(super) storage: &'a Storage,
    lock: Lock<'a>,
}

/// The locks one operation holds on the storages it touches, from
/// [`lock_storages`]; the slices it hands out borrow it, so they cannot
/// outlive the locks.
pub(crate) struct StorageLocks<'a> {
    /// Each distinct storage with its lock, in address order.
    pub(super) held: Vec<Held<'a>>,
}

/// Locks each distinct storage once, in address order: for writing if it is in
/// `writes`, else for reading. A storage in both is locked once, for writing.
pub(crate) fn lock_storages<'a>(reads: &[&'a Storage], writes: &[&'a Storage]) -> StorageLocks<'a> {
    let mut all: Vec<(&'a Storage, bool)> =
        writes.iter().map(|s| (*s, true)).chain(reads.iter().map(|s| (*s, false))).collect();
    // Writers sort first among equal addresses, so dedup keeps the write.
    all.sort_by_key(|(s, write)| (*s as *const Storage as usize, !*write));
    all.dedup_by_key(|(s, _)| *s as *const Storage as usize);
    let held = all
        .into_iter()
        .map(|(storage, write)| Held {
            storage,
            lock: if write { Lock::Write(storage.write_lock()) } else { Lock::Read(storage.read_lock()) },
        })
        .collect();
    StorageLocks { held }
}

fn not_locked(op: &'static str, what: &str) -> TensorError {
    TensorError::internal(op, format!("a storage {what} by this operation's locks"))
}

impl StorageLocks<'_> {
    fn position(&self, storage: &Storage) -> Option<usize> {
        self.held.iter().position(|h| std::ptr::eq(h.storage, storage))
    }

    /// The elements of `storage`, one of the locked ones (read or written),
    /// as `T` (its dtype, else an error naming `op`).
    pub(crate) fn read<T: WithDType>(&self, storage: &Storage, op: &'static str) -> Result<&[T]> {
        let at = self.position(storage).ok_or_else(|| not_locked(op, "not locked"))?;
        let storage = self.held[at].storage;
        let count = storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the lock taken in
        // `lock_storages` is held while `self` lives, which the slice borrows,
        // and while it is borrowed `write` (`&mut self`) hands out no `&mut`.
        unsafe { storage.shared(op, count) }
    }

    /// The elements of `storage`, locked for writing, as `&mut [T]`, with
    /// read access to the other locked storages. Reading `storage` itself
    /// through the second value is an error: read it through the first.
    pub(crate) fn write<T: WithDType>(
        &mut self,
        storage: &Storage,
        op: &'static str,
    ) -> Result<(&mut [T], LockedReads<'_>)> {
        let at = self.position(storage).ok_or_else(|| not_locked(op, "not locked"))?;
        let held = &self.held[at];
        if !matches!(held.lock, Lock::Write(_)) {
            return Err(not_locked(op, "read but not write-locked"));
        }
        let count = held.storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the write lock is held
        // while `self` lives, and `&mut self` (borrowed by both returned
        // values) keeps every other slice of this set from living meanwhile;
        // `LockedReads` refuses this storage.
        let data = unsafe { held.storage.exclusive(op, count)? };
        Ok((data, LockedReads { held: &self.held, written: Written::One(at) }))
    }

    /// [`StorageLocks::write`] for several distinct write-locked storages at
    /// once (a fused update writing a parameter and its optimizer state):
    /// their elements as `&mut [T]`, in the order of `storages`, with read
    /// access to the other locked storages. A storage named twice is an error.
    pub(crate) fn write_many<T: WithDType>(
        &mut self,
        storages: &[&Storage],
        op: &'static str,
    ) -> Result<(Vec<&mut [T]>, LockedReads<'_>)> {
        let mut positions = Vec::with_capacity(storages.len());
        for storage in storages {
            let at = self.position(storage).ok_or_else(|| not_locked(op, "not locked"))?;
            if !matches!(self.held[at].lock, Lock::Write(_)) {
                return Err(not_locked(op, "read but not write-locked"));
            }
            if positions.contains(&at) {
                return Err(TensorError::invalid(
                    op,
                    "two of the tensors it writes share one storage; give each its own memory",
                ));
            }
            positions.push(at);
        }
        let mut slices = Vec::with_capacity(storages.len());
        for &at in &positions {
            let storage = self.held[at].storage;
            let count = storage.element_count::<T>(op)?;
            // SAFETY: as in `write`: each storage is write-locked while `self`
            // lives, the positions are distinct so no two slices alias, and
            // `LockedReads` refuses all of them.
            slices.push(unsafe { storage.exclusive(op, count)? });
        }
        Ok((slices, LockedReads { held: &self.held, written: Written::Many(positions) }))
    }
}

/// Which held storages a [`LockedReads`] must not hand out.
enum Written {
    One(usize),
    Many(Vec<usize>),
}

impl Written {
    fn contains(&self, at: usize) -> bool {
        match self {
            Written::One(w) => *w == at,
            Written::Many(ws) => ws.contains(&at),
        }
    }
}

/// Read access to the storages of a [`StorageLocks`] but the one being written.
pub(crate) struct LockedReads<'r> {
    held: &'r [Held<'r>],
    written: Written,
}

impl<'r> LockedReads<'r> {
    /// The elements of `storage`, a locked one other than the written one.
    pub(crate) fn read<T: WithDType>(&self, storage: &Storage, op: &'static str) -> Result<&'r [T]> {
        let at = self
            .held
            .iter()
            .position(|h| std::ptr::eq(h.storage, storage))
            .ok_or_else(|| not_locked(op, "not locked"))?;
        if self.written.contains(at) {
            return Err(TensorError::internal(
                op,
                "the written storage is read through its `&mut` slice, not as a second slice",
            ));
        }
        let storage = self.held[at].storage;
        let count = storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the lock is held for
        // `'r` (the borrow of the `StorageLocks`), and this is not the storage
        // whose `&mut` slice lives beside these.
        unsafe { storage.shared(op, count) }
    }
}
