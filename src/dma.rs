//! The "DMA" layer: memory the application owns, registered as a memory region that the
//! transport reads and writes in place (zero copy), as an HCA's DMA engine does.
//!
//! A [`UserMemory`] is a handle to such bytes. The engine and the verbs layer hold it and use
//! only its safe methods: every access, the device's and the application's through the
//! handle, runs under the handle's lock, so the two never overlap (the Rust rule that a
//! `&mut [u8]` is the only way to the bytes while it lives holds). The one `unsafe` step is
//! [`UserMemory::new`], taking memory from a raw pointer: its caller promises the memory
//! stays valid and is left to the handle, which is what registering memory with an RDMA
//! device asks of a C program too. [`UserMemory::from_vec`] takes a `Vec` the caller gives
//! up, with nothing to promise: the bytes stay where the `Vec` had them (no copy) and are
//! freed with the last handle.
//!
//! After deregistration (see `engine::MrTable::remove`) the device never touches the memory
//! again: the MR's storage is marked dead under this lock, so an access already past its
//! key check fails instead of writing into memory the caller may have freed.
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Why a [`UserMemory`] could not be made or reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// [`UserMemory::new`] got a null pointer.
    #[error("user memory at a null pointer")]
    Null,
    /// [`UserMemory::new`] got more than `isize::MAX` bytes (no allocation is that large).
    #[error("user memory of {0} bytes is larger than any allocation (isize::MAX)")]
    TooLarge(usize),
    /// A range outside the memory.
    #[error("range offset {offset} + {len} bytes is outside user memory of {size} bytes")]
    OutOfRange {
        /// Offset from the handle's first byte.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// The handle's length.
        size: usize,
    },
}

/// Application memory a memory region can be registered on (see `Pd::reg_user_mr`): the
/// device reads and writes these very bytes, no copy in between.
///
/// Cloning gives another handle to the same bytes; [`UserMemory::slice`] a handle to part of
/// them. All handles made from one `new` or `from_vec` share one lock.
#[derive(Clone)]
pub struct UserMemory {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

/// The memory as a whole: where it is, its lock, and who frees it.
struct Region {
    base: NonNull<u8>,
    len: usize,
    /// Held for every access through any handle: a `&mut [u8]` to the bytes exists only
    /// under it.
    lock: Mutex<()>,
    /// `Some(capacity)` for a `Vec` given up to `from_vec`: rebuilt and freed on drop.
    vec_capacity: Option<usize>,
}

// Safety: a Region is a pointer to bytes no one else reaches (the contract of `new`, or
// the Vec given up in `from_vec`), and every access to them is made under `lock`; plain
// bytes have no thread affinity, so the handle may move to and be shared by any thread.
unsafe impl Send for Region {}
// Safety: as for Send: shared access goes through `lock`, one thread at a time.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(capacity) = self.vec_capacity {
            // Safety: `base`, `len` and `capacity` are the raw parts of the Vec that
            // `from_vec` took apart and nothing else owns; this is the last handle (the
            // Region drops with the last Arc), so no slice of the bytes is alive.
            drop(unsafe { Vec::from_raw_parts(self.base.as_ptr(), self.len, capacity) });
        }
    }
}

impl UserMemory {
    /// A handle to the `len` bytes at `ptr`, which the caller keeps owning (memory from
    /// `mmap`, a C allocation, a buffer of its own).
    ///
    /// # Safety
    /// - `ptr` must be valid for reads and writes of `len` bytes, within one allocation,
    ///   and stay valid (mapped, writable, not freed) until both the caller has dropped
    ///   every handle it made from this one (clones and slices) and every memory region
    ///   registered on it has been deregistered (its last `Mr` handle dropped, or moved
    ///   elsewhere by a re-registration). From then on the device never touches the bytes,
    ///   even if the engine still holds a handle for a moment.
    /// - Until then, nothing reaches the bytes but these handles: no reference to them
    ///   outside a [`UserMemory::with_bytes`] call, no access through another pointer and
    ///   no second `UserMemory::new` over any of them — as for memory handed to a DMA
    ///   engine, whose accesses the program cannot see.
    // Safety: the caller's promise above is what `with_bytes` relies on; this function only
    // records the pointer.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<UserMemory, DmaError> {
        let base = NonNull::new(ptr).ok_or(DmaError::Null)?;
        if len > isize::MAX as usize {
            return Err(DmaError::TooLarge(len));
        }
        Ok(UserMemory::of(Region {
            base,
            len,
            lock: Mutex::new(()),
            vec_capacity: None,
        }))
    }

    /// A handle to the bytes of `bytes`, which it frees with the last handle. The bytes stay
    /// where they are (`as_ptr()` is `bytes.as_ptr()`): registering it does not copy them.
    pub fn from_vec(bytes: Vec<u8>) -> UserMemory {
        let mut bytes = ManuallyDrop::new(bytes);
        let (len, capacity) = (bytes.len(), bytes.capacity());
        // A Vec's pointer is never null (a dangling, aligned one when it has no capacity).
        let base = NonNull::new(bytes.as_mut_ptr()).unwrap_or_else(NonNull::dangling);
        UserMemory::of(Region {
            base,
            len,
            lock: Mutex::new(()),
            vec_capacity: Some(capacity),
        })
    }

    /// `len` zeroed bytes of the application's (a `Vec` given to [`UserMemory::from_vec`]).
    pub fn zeroed(len: usize) -> UserMemory {
        UserMemory::from_vec(vec![0; len])
    }

    fn of(region: Region) -> UserMemory {
        let len = region.len;
        UserMemory {
            region: Arc::new(region),
            offset: 0,
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the handle covers no byte (no region can be registered on it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte, where the caller's own pointer points (for showing
    /// that the device worked in place; reading through it is the caller's `unsafe`).
    pub fn as_ptr(&self) -> *const u8 {
        self.region.base.as_ptr().wrapping_add(self.offset)
    }

    /// A handle to `len` bytes from `offset` of these (sharing their lock): to register a
    /// part of a buffer.
    pub fn slice(&self, offset: usize, len: usize) -> Result<UserMemory, DmaError> {
        self.check(offset, len)?;
        Ok(UserMemory {
            region: self.region.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// Whether both handles reach the same memory as a whole (the same `new` or `from_vec`).
    pub fn same_memory(&self, other: &UserMemory) -> bool {
        Arc::ptr_eq(&self.region, &other.region)
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Runs `f` on the bytes themselves, under the lock every access takes: the device does
    /// not read or write them meanwhile. `f` must not reach this memory again (through any
    /// handle: the lock is not reentrant) nor call the device (which may be waiting for the
    /// lock).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // A panic in an earlier `f` leaves bytes, not a broken invariant.
        let _held = self.region.lock.lock().unwrap_or_else(|p| p.into_inner());
        // Safety: `offset + len <= region.len` (checked where the handle was made), so the
        // range lies in the memory `new`'s caller vouched for, or in the Vec `from_vec`
        // took. It is valid until the last handle is gone (`new`'s contract, or Region's
        // drop), and `_held` makes this slice the only way to the bytes while it lives:
        // every access goes through this function, and nothing else reaches them (`new`'s
        // contract, or a given-up Vec, which has no other owner).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.region.base.as_ptr().add(self.offset), self.len)
        };
        f(bytes)
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, out.len())?;
        self.with_bytes(|b| out.copy_from_slice(&b[offset..offset + out.len()]));
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        self.check(offset, data.len())?;
        self.with_bytes(|b| b[offset..offset + data.len()].copy_from_slice(data));
        Ok(())
    }

    /// A copy of all the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with_bytes(|b| b.to_vec())
    }
}

impl std::fmt::Debug for UserMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserMemory")
            .field("addr", &self.as_ptr())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vec_stays_where_it_was_and_is_reached_in_place() {
        let v = vec![7u8; 100];
        let at = v.as_ptr();
        let mem = UserMemory::from_vec(v);
        assert_eq!(mem.as_ptr(), at);
        mem.write(10, b"abc").unwrap();
        let part = mem.slice(10, 3).unwrap();
        assert_eq!(part.as_ptr(), at.wrapping_add(10));
        assert_eq!(part.to_vec(), b"abc");
        assert!(part.same_memory(&mem));
        assert!(!part.same_memory(&UserMemory::zeroed(3)));
        let mut out = [0u8; 4];
        mem.read(9, &mut out).unwrap();
        assert_eq!(&out, b"\x07abc");
    }

    #[test]
    fn ranges_outside_are_errors_not_panics() {
        let mem = UserMemory::zeroed(16);
        assert_eq!(
            mem.write(10, &[1; 7]),
            Err(DmaError::OutOfRange {
                offset: 10,
                len: 7,
                size: 16
            })
        );
        assert!(mem.slice(usize::MAX, 2).is_err());
        assert!(mem.slice(4, 12).unwrap().read(1, &mut [0; 12]).is_err());
        assert_eq!(mem.to_vec(), [0; 16], "a refused write changed nothing");
    }

    #[test]
    fn new_refuses_null_and_oversized_memory() {
        // Safety: neither call reaches the memory: both are refused before a handle exists.
        let null = unsafe { UserMemory::new(std::ptr::null_mut(), 8) };
        assert_eq!(null.unwrap_err(), DmaError::Null);
        let mut byte = 0u8;
        // Safety: as above (refused for its length).
        let huge = unsafe { UserMemory::new(&mut byte, usize::MAX) };
        assert_eq!(huge.unwrap_err(), DmaError::TooLarge(usize::MAX));
    }

    #[test]
    fn memory_from_a_pointer_is_the_callers_own() {
        let mut buf = vec![0u8; 32];
        let ptr = buf.as_mut_ptr();
        // Safety: `buf` outlives the handle (dropped at the end of this block) and is not
        // touched until then.
        let mem = unsafe { UserMemory::new(ptr, 32) }.unwrap();
        mem.write(0, b"in place").unwrap();
        drop(mem);
        assert_eq!(&buf[..8], b"in place");
    }
}
