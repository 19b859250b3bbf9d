//! Memory regions: the engine owns each MR's bytes (a `Vec<u8>` at an iova base), so the
//! transport can read and write them without `unsafe`; the verbs layer reaches them through
//! `Engine::mr_read` / `mr_write`.
//!
//! The table is shared by the engine shards of one device ([`super::Engine::new_shards`]):
//! any shard's responder may write a region another shard's requester reads. Readers load
//! the current table through an `ArcSwap` (no shared lock: cores reading it do not contend
//! for a cache line); registering and deregistering publish a new copy. Each region's bytes
//! are behind their own mutex, held for one copy: shards working on different regions never
//! wait for each other, as on an HCA whose DMA engines work in parallel.
//!
//! Keys are `index << 8 | tag`: the low byte changes each time a slot is reused, so a stale
//! key of a deregistered MR does not match its successor (IBTA 10.6.3, the "key" portion).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, Guard};

use super::types::{Access, PdId, Sge};

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
    data: Mutex<Vec<u8>>,
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

    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        // A copy that panicked half-way leaves bytes, not a broken invariant.
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    /// used up (never wrapped: two regions must not overlap).
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        self.update(|t| t.register(pd, len, access))
    }
}

impl MrSlots {
    fn register(&mut self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        let t = self;
        if t.next_iova == 0 {
            t.next_iova = IOVA_BASE;
        }
        let iova = t.next_iova;
        // Page-align the next region and leave a guard page between regions.
        let next = (len as u64)
            .checked_add(4095)
            .map(|l| l & !4095)
            .and_then(|l| l.checked_add(4096))
            .and_then(|l| iova.checked_add(l))?;
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
        t.next_iova = next;
        t.slots[idx] = Some(Arc::new(Mr {
            pd,
            key,
            iova,
            access,
            len,
            rkey_valid: AtomicBool::new(true),
            data: Mutex::new(vec![0; len]),
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
    pub fn remove(&self, key: u32) -> bool {
        self.update(|t| {
            let Some(idx) = t.get(key).map(|_| (key >> 8) as usize - 1) else {
                return false;
            };
            t.slots[idx] = None;
            true
        })
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
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            out[done..done + take].copy_from_slice(&mr.bytes()[r]);
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
                .find_map(|mr| mr.range(sge.addr, len as u64).map(|r| (mr, r)));
            let Some((mr, r)) = found else {
                return false;
            };
            out[done..done + len].copy_from_slice(&mr.bytes()[r]);
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
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            mr.bytes()[r].copy_from_slice(&data[done..done + take]);
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
        let mr = t.get(key)?;
        let r = mr.range(va, len)?;
        let bytes = mr.bytes();
        Some(f(&bytes[r]))
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
        let mr = t.get(key)?;
        let r = mr.range(va, len)?;
        let mut bytes = mr.bytes();
        Some(f(&mut bytes[r]))
    }
}
