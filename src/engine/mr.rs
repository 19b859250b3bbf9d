//! Memory regions: the engine owns each MR's bytes (a `Vec<u8>` at an iova base), so the
//! transport can read and write them without `unsafe`; the verbs layer reaches them through
//! `Engine::mr_read` / `mr_write`.
//!
//! Keys are `index << 8 | tag`: the low byte changes each time a slot is reused, so a stale
//! key of a deregistered MR does not match its successor (IBTA 10.6.3, the "key" portion).
use super::types::{Access, PdId, Sge};

/// One registered memory region.
#[derive(Debug)]
pub(crate) struct Mr {
    pub pd: PdId,
    pub key: u32,
    pub iova: u64,
    pub access: Access,
    pub data: Vec<u8>,
    /// False after a remote SEND_WITH_INV invalidated the R_Key.
    pub rkey_valid: bool,
}

impl Mr {
    /// The byte range of `[addr, addr+len)` inside `data`, if it is in bounds.
    pub fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let start = addr.checked_sub(self.iova)?;
        let end = start.checked_add(len)?;
        if end > self.data.len() as u64 {
            return None;
        }
        Some(start as usize..end as usize)
    }
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

/// Registered MRs, indexed by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    slots: Vec<Option<Mr>>,
    tags: Vec<u8>,
    next_iova: u64,
}

/// Base of the iova space handed out to MRs: far from zero so a null address never matches.
const IOVA_BASE: u64 = 0x0000_7f00_0000_0000;

impl MrTable {
    /// Register `len` zeroed bytes; returns (key, iova), or `None` when the iova space is
    /// used up (never wrapped: two regions must not overlap).
    pub fn register(&mut self, pd: PdId, len: usize, access: Access) -> Option<(u32, u64)> {
        if self.next_iova == 0 {
            self.next_iova = IOVA_BASE;
        }
        let iova = self.next_iova;
        // Page-align the next region and leave a guard page between regions.
        let next = (len as u64)
            .checked_add(4095)
            .map(|l| l & !4095)
            .and_then(|l| l.checked_add(4096))
            .and_then(|l| iova.checked_add(l))?;
        let idx = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            // The index fills the key's upper 24 bits: no more regions than that.
            None if self.slots.len() + 1 >= 1 << 24 => return None,
            None => {
                self.slots.push(None);
                self.tags.push(0);
                self.slots.len() - 1
            }
        };
        self.tags[idx] = self.tags[idx].wrapping_add(0x35) | 1;
        let key = ((idx as u32 + 1) << 8) | self.tags[idx] as u32;
        self.next_iova = next;
        self.slots[idx] = Some(Mr {
            pd,
            key,
            iova,
            access,
            data: vec![0; len],
            rkey_valid: true,
        });
        Some((key, iova))
    }

    fn index(key: u32) -> Option<usize> {
        ((key >> 8) as usize).checked_sub(1)
    }

    pub fn get(&self, key: u32) -> Option<&Mr> {
        let mr = self.slots.get(Self::index(key)?)?.as_ref()?;
        (mr.key == key).then_some(mr)
    }

    pub fn get_mut(&mut self, key: u32) -> Option<&mut Mr> {
        let mr = self.slots.get_mut(Self::index(key)?)?.as_mut()?;
        (mr.key == key).then_some(mr)
    }

    pub fn remove(&mut self, key: u32) -> Option<Mr> {
        let idx = Self::index(key)?;
        if self.get(key).is_some() {
            self.slots[idx].take()
        } else {
            None
        }
    }

    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd)
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
        let mr = self.get(rkey).ok_or(AccessFault::BadKey)?;
        if !mr.rkey_valid {
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
        let mut total = 0u64;
        for sge in sges {
            let mr = self.get(sge.lkey).ok_or(AccessFault::BadKey)?;
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
            let Some(mr) = self.get(sge.lkey) else {
                return false;
            };
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            out[done..done + take].copy_from_slice(&mr.data[r]);
            done += take;
            offset = 0;
        }
        done == out.len()
    }

    /// Copy `data` into the SGE list starting `offset` bytes in. Returns false if it does
    /// not fit or an MR is gone.
    pub fn scatter(&mut self, sges: &[Sge], mut offset: u64, data: &[u8]) -> bool {
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
            let Some(mr) = self.get_mut(sge.lkey) else {
                return false;
            };
            let Some(r) = sge
                .addr
                .checked_add(offset)
                .and_then(|a| mr.range(a, take as u64))
            else {
                return false;
            };
            mr.data[r].copy_from_slice(&data[done..done + take]);
            done += take;
            offset = 0;
        }
        done == data.len()
    }

    /// Bytes at `[va, va+len)` of the MR `key` (already checked by `check_remote`).
    pub fn slice(&self, key: u32, va: u64, len: u64) -> Option<&[u8]> {
        let mr = self.get(key)?;
        let r = mr.range(va, len)?;
        Some(&mr.data[r])
    }

    /// Mutable bytes at `[va, va+len)` of the MR `key`.
    pub fn slice_mut(&mut self, key: u32, va: u64, len: u64) -> Option<&mut [u8]> {
        let mr = self.get_mut(key)?;
        let r = mr.range(va, len)?;
        Some(&mut mr.data[r])
    }
}
