//! Memory regions: each MR's bytes are either the engine's own (a `Vec<u8>`) or the
//! application's (a [`UserMemory`] of the DMA layer, read and written in place); either way
//! the transport reaches them without `unsafe` here, through the storage's safe methods, and
//! the verbs layer through `Engine::mr_read` / `mr_write`. Every region sits at an iova the
//! table hands out, whatever its storage.
//!
//! The table is shared by the engine shards of one device ([`super::Engine::new_shards`]):
//! any shard's responder may write a region another shard's requester reads. Readers load
//! the current table through an `ArcSwap` (no shared lock: cores reading it do not contend
//! for a cache line); registering, re-registering and deregistering publish a new copy.
//! Each region's bytes are behind their own lock, held for one copy: shards working on
//! different regions never wait for each other, as on an HCA whose DMA engines work in
//! parallel.
//!
//! Keys are `index << 8 | tag`: the low byte changes each time a slot is reused, so a stale
//! key of a deregistered MR does not match its successor (IBTA 10.6.3, the "key" portion).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};

use super::types::{Access, PdId, Sge};
use crate::driver::dma::UserMemory;

/// One registered memory region.
#[derive(Debug)]
pub(crate) struct Mr {
    pub pd: PdId,
    pub key: u32,
    pub iova: u64,
    pub access: Access,
    pub len: usize,
    /// False after a remote SEND_WITH_INV invalidated the R_Key.
    pub rkey_valid: AtomicBool,
    /// Shared by the versions of the region a re-registration that keeps the translation
    /// publishes.
    data: Arc<MrBytes>,
}

/// Where a region's bytes are.
#[derive(Debug)]
enum MrBytes {
    /// The engine's own.
    Device(Mutex<Vec<u8>>),
    /// The application's, under the memory's own lock. `live` turns false (under that lock)
    /// when the region is deregistered or moved elsewhere: from then on no access reaches
    /// the memory, not even one whose key check passed before, so the caller may free it.
    User {
        memory: UserMemory,
        live: AtomicBool,
    },
}

impl MrBytes {
    /// Runs `f` on the bytes `range`, under their lock; `None` if the range is outside them
    /// or the application's memory is no longer the region's.
    fn with<R>(&self, range: std::ops::Range<usize>, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match self {
            MrBytes::Device(bytes) => {
                // A copy that panicked half-way leaves bytes, not a broken invariant.
                let mut bytes = bytes.lock().unwrap_or_else(|p| p.into_inner());
                bytes.get_mut(range).map(f)
            }
            MrBytes::User { memory, live } => memory.with_bytes(|bytes| {
                if !live.load(Ordering::Acquire) {
                    return None;
                }
                bytes.get_mut(range).map(f)
            }),
        }
    }

    /// The region is gone from the table: no later access may reach the bytes. Taking the
    /// memory's lock waits for an access under way to end.
    fn retire(&self) {
        if let MrBytes::User { memory, live } = self {
            memory.with_bytes(|_| live.store(false, Ordering::Release));
        }
    }

    fn user(&self) -> Option<&UserMemory> {
        match self {
            MrBytes::User { memory, .. } => Some(memory),
            MrBytes::Device(_) => None,
        }
    }
}

impl Mr {
    /// The byte range of `[addr, addr+len)` inside the region, if it is in bounds.
    pub fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let start = addr.checked_sub(self.iova)?;
        let end = start.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some(start as usize..end as usize)
    }

    /// Runs `f` on the bytes `[addr, addr+len)`; `None` if out of bounds or gone.
    fn with_range<R>(&self, addr: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let r = self.range(addr, len)?;
        self.data.with(r, f)
    }
}

/// The bytes a region is registered on: the engine's (zeroed) or the application's.
#[derive(Clone, Debug)]
pub enum MrMemory {
    /// This many zeroed bytes the engine owns (`Engine::reg_mr`).
    Device(usize),
    /// The application's memory, read and written in place.
    User(UserMemory),
}

impl MrMemory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MrMemory::Device(len) => *len,
            MrMemory::User(memory) => memory.len(),
        }
    }

    /// Whether it has no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn into_bytes(self) -> MrBytes {
        match self {
            MrMemory::Device(len) => MrBytes::Device(Mutex::new(vec![0; len])),
            MrMemory::User(memory) => MrBytes::User {
                memory,
                live: AtomicBool::new(true),
            },
        }
    }
}

/// What a re-registration changes (`ibv_rereg_mr`'s `IBV_REREG_MR_CHANGE_*`); `None` keeps
/// it. Checked by the caller (PD exists, access rules).
#[derive(Debug, Default)]
pub(crate) struct MrUpdate {
    pub memory: Option<MrMemory>,
    pub pd: Option<PdId>,
    pub access: Option<Access>,
}

/// What a caller may know of a region without touching its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrFacts {
    pub pd: PdId,
    pub key: u32,
    pub iova: u64,
    pub access: Access,
    pub len: usize,
    pub rkey_valid: bool,
}

/// Why a remote or local memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AccessFault {
    /// No MR with this key (or a stale key, or an invalidated R_Key).
    BadKey,
    /// The MR belongs to another PD than the QP.
    WrongPd,
    /// The MR (or QP) does not grant the access.
    NoPermission,
    /// The range is outside the MR.
    OutOfBounds,
}

/// Registered MRs, indexed by key (shared by a device's engine shards).
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    current: ArcSwap<MrSlots>,
    /// Held by whoever publishes a new table (register, remove), so no change is lost.
    writer: Mutex<()>,
}

#[derive(Clone, Debug, Default)]
struct MrSlots {
    slots: Vec<Option<Arc<Mr>>>,
    tags: Vec<u8>,
    next_iova: u64,
}

impl MrSlots {
    fn get(&self, key: u32) -> Option<&Mr> {
        let idx = ((key >> 8) as usize).checked_sub(1)?;
        let mr = self.slots.get(idx)?.as_ref()?;
        (mr.key == key).then_some(mr)
    }
}

/// Base of the iova space handed out to MRs: far from zero so a null address never matches.
const IOVA_BASE: u64 = 0x0000_7f00_0000_0000;

impl MrTable {
    fn read(&self) -> Guard<Arc<MrSlots>> {
        self.current.load()
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    fn update<R>(&self, change: impl FnOnce(&mut MrSlots) -> R) -> R {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut table = MrSlots::clone(&self.current.load());
        let out = change(&mut table);
        self.current.store(Arc::new(table));
        out
    }

    /// Register `len` zeroed bytes; returns (key, iova), or `None` when the iova space is
    /// used up (never wrapped: two regions must not overlap). For unit tests.
    #[cfg(test)]
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        self.register_on(pd, MrMemory::Device(len), access)
    }

    /// Register a region on `memory`; as [`MrTable::register`].
    pub fn register_on(&self, pd: PdId, memory: MrMemory, access: Access) -> Option<(u32, u64)> {
        self.update(|t| t.register(pd, memory, access))
    }

    /// Re-register the region `key` (same key): a new PD or access applies to the next
    /// access checked, new memory gets a fresh iova and the old memory is never reached
    /// again once this returns. Returns the new iova, or `None` if there is no such region
    /// or no iova space left (the region is then unchanged).
    pub fn reregister(&self, key: u32, change: MrUpdate) -> Option<u64> {
        let retired = self.update(|t| {
            let idx = t.get(key).map(|_| (key >> 8) as usize - 1)?;
            let old = t.slots[idx].clone()?;
            let (iova, len, data) = match change.memory {
                Some(memory) => {
                    let len = memory.len();
                    (t.alloc_iova(len)?, len, Arc::new(memory.into_bytes()))
                }
                None => (old.iova, old.len, old.data.clone()),
            };
            let moved = !Arc::ptr_eq(&data, &old.data);
            t.slots[idx] = Some(Arc::new(Mr {
                pd: change.pd.unwrap_or(old.pd),
                key,
                iova,
                access: change.access.unwrap_or(old.access),
                len,
                // A re-registration is a new registration (ibv_rereg_mr(3)): its R_Key works.
                rkey_valid: AtomicBool::new(true),
                data,
            }));
            Some((iova, moved.then_some(old)))
        });
        let (iova, old) = retired?;
        if let Some(old) = old {
            old.data.retire();
        }
        Some(iova)
    }

    /// The application's memory the region `key` is registered on, if it is.
    pub fn user_memory(&self, key: u32) -> Option<UserMemory> {
        self.read().get(key)?.data.user().cloned()
    }
}

impl MrSlots {
    /// A fresh iova range for `len` bytes, page aligned with a guard page after it; `None`
    /// once the iova space is used up (never wrapped: two regions must not overlap).
    fn alloc_iova(&mut self, len: usize) -> Option<u64> {
        if self.next_iova == 0 {
            self.next_iova = IOVA_BASE;
        }
        let iova = self.next_iova;
        let next = (len as u64)
            .checked_add(4095)
            .map(|l| l & !4095)
            .and_then(|l| l.checked_add(4096))
            .and_then(|l| iova.checked_add(l))?;
        self.next_iova = next;
        Some(iova)
    }

    fn register(&mut self, pd: PdId, memory: MrMemory, access: Access) -> Option<(u32, u64)> {
        let t = self;
        let len = memory.len();
        let iova = t.alloc_iova(len)?;
        let idx = match t.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            // The index fills the key's upper 24 bits: no more regions than that.
            None if t.slots.len() + 1 >= 1 << 24 => return None,
            None => {
                t.slots.push(None);
                t.tags.push(0);
                t.slots.len() - 1
            }
        };
        t.tags[idx] = t.tags[idx].wrapping_add(0x35) | 1;
        let key = ((idx as u32 + 1) << 8) | t.tags[idx] as u32;
        t.slots[idx] = Some(Arc::new(Mr {
            pd,
            key,
            iova,
            access,
            len,
            rkey_valid: AtomicBool::new(true),
            data: Arc::new(memory.into_bytes()),
        }));
        Some((key, iova))
    }
}

impl MrTable {
    /// The facts of the region `key`, if it exists.
    pub fn facts(&self, key: u32) -> Option<MrFacts> {
        self.read().get(key).map(|mr| MrFacts {
            pd: mr.pd,
            key: mr.key,
            iova: mr.iova,
            access: mr.access,
            len: mr.len,
            rkey_valid: mr.rkey_valid.load(Ordering::Relaxed),
        })
    }

    /// Deregister `key`; false if there is no such region.
    /// Once it returns, no access reaches the region's bytes (an access that loaded the
    /// table before fails on the retired storage).
    pub fn remove(&self, key: u32) -> bool {
        let removed = self.update(|t| {
            let idx = t.get(key).map(|_| (key >> 8) as usize - 1)?;
            t.slots[idx].take()
        });
        match removed {
            Some(mr) => {
                mr.data.retire();
                true
            }
            None => false,
        }
    }

    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.read().slots.iter().flatten().any(|m| m.pd == pd)
    }

    /// SEND with invalidate: the R_Key `key` of PD `pd` stops working. False if there is no
    /// such region in that PD.
    pub fn invalidate(&self, key: u32, pd: PdId) -> bool {
        match self.read().get(key) {
            Some(mr) if mr.pd == pd => {
                mr.rkey_valid.store(false, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Check a remote access through an R_Key (responder side, IBTA 9.7.4.1.5).
    pub fn check_remote(
        &self,
        rkey: u32,
        pd: PdId,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(), AccessFault> {
        let t = self.read();
        let mr = t.get(rkey).ok_or(AccessFault::BadKey)?;
        if !mr.rkey_valid.load(Ordering::Relaxed) {
            return Err(AccessFault::BadKey);
        }
        if mr.pd != pd {
            return Err(AccessFault::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(AccessFault::NoPermission);
        }
        mr.range(va, len).ok_or(AccessFault::OutOfBounds)?;
        Ok(())
    }

    /// Check an SGE list for a local access; returns the total length.
    pub fn check_sges(&self, pd: PdId, sges: &[Sge], need: Access) -> Result<u64, AccessFault> {
        let t = self.read();
        let mut total = 0u64;
        for sge in sges {
            let mr = t.get(sge.lkey).ok_or(AccessFault::BadKey)?;
            if mr.pd != pd {
                return Err(AccessFault::WrongPd);
            }
            if !mr.access.contains(need) {
                return Err(AccessFault::NoPermission);
            }
            mr.range(sge.addr, sge.length as u64)
                .ok_or(AccessFault::OutOfBounds)?;
            // At most max_sge x u32::MAX: no overflow in u64.
            total += sge.length as u64;
        }
        Ok(total)
    }

    /// Copy `out.len()` bytes starting `offset` bytes into the SGE list's data.
    /// Returns false if the SGEs are no longer valid (MR deregistered meanwhile).
    pub fn gather(&self, sges: &[Sge], mut offset: u64, out: &mut [u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            if done == out.len() {
                break;
            }
            if offset >= sge.length as u64 {
                offset -= sge.length as u64;
                continue;
            }
            let take = ((sge.length as u64 - offset) as usize).min(out.len() - done);
            let Some(mr) = t.get(sge.lkey) else {
                return false;
            };
            let dst = &mut out[done..done + take];
            let copied = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.with_range(a, take as u64, |b| dst.copy_from_slice(b)));
            if copied.is_none() {
                return false;
            }
            done += take;
            offset = 0;
        }
        done == out.len()
    }

    /// Copy an inline SGE list's bytes into `out`, finding each SGE's memory by its address
    /// alone: as for `IBV_SEND_INLINE`, where the provider reads the caller's memory itself,
    /// the lkey is not checked (iovas of regions never overlap, so an address names one
    /// region). False if an SGE is not inside a registered region.
    pub fn gather_by_addr(&self, sges: &[Sge], out: &mut [u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            let len = sge.length as usize;
            if out.len() - done < len {
                return false;
            }
            let found = t
                .slots
                .iter()
                .flatten()
                .find(|mr| mr.range(sge.addr, len as u64).is_some());
            let dst = &mut out[done..done + len];
            let copied = found
                .and_then(|mr| mr.with_range(sge.addr, len as u64, |b| dst.copy_from_slice(b)));
            if copied.is_none() {
                return false;
            }
            done += len;
        }
        done == out.len()
    }

    /// Copy `data` into the SGE list starting `offset` bytes in. Returns false if it does
    /// not fit or an MR is gone.
    pub fn scatter(&self, sges: &[Sge], mut offset: u64, data: &[u8]) -> bool {
        let t = self.read();
        let mut done = 0usize;
        for sge in sges {
            if done == data.len() {
                break;
            }
            if offset >= sge.length as u64 {
                offset -= sge.length as u64;
                continue;
            }
            let take = ((sge.length as u64 - offset) as usize).min(data.len() - done);
            let Some(mr) = t.get(sge.lkey) else {
                return false;
            };
            let src = &data[done..done + take];
            let copied = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.with_range(a, take as u64, |b| b.copy_from_slice(src)));
            if copied.is_none() {
                return false;
            }
            done += take;
            offset = 0;
        }
        done == data.len()
    }

    /// Whether `[va, va+len)` lies inside the MR `key`.
    pub fn in_bounds(&self, key: u32, va: u64, len: u64) -> bool {
        self.read()
            .get(key)
            .is_some_and(|mr| mr.range(va, len).is_some())
    }

    /// Runs `f` on the bytes at `[va, va+len)` of the MR `key` (already checked by
    /// `check_remote`); `None` if they are gone. `f` must not touch the table.
    pub fn with_bytes<R>(
        &self,
        key: u32,
        va: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let t = self.read();
        t.get(key)?.with_range(va, len, |b| f(b))
    }

    /// Runs `f` on the writable bytes at `[va, va+len)` of the MR `key`; `None` if they are
    /// gone. `f` must not touch the table.
    pub fn with_bytes_mut<R>(
        &self,
        key: u32,
        va: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let t = self.read();
        t.get(key)?.with_range(va, len, f)
    }
}
