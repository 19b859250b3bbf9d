//! A table the engine shards of a device share (its MRs and windows, CQs, SRQs): read on
//! every packet, changed only when an object is created or destroyed.
//!
//! A change copies the table and publishes the copy ([`ArcSwap`]: readers never lock). Each
//! shard reads through its own view, which keeps the last snapshot it loaded with the
//! table's generation then: in the steady state a read is one plain load of the generation,
//! not arc-swap's bookkeeping (several loads per packet were a sixth of the engine's own
//! time). A view sees a change at its first read after the change was published, as an
//! arc-swap load would.
use std::cell::{Ref, RefCell};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, Guard};

struct Published<T> {
    current: ArcSwap<T>,
    /// Bumped after each publication.
    generation: AtomicU64,
    /// Held by whoever publishes, so no change is lost.
    writer: Mutex<()>,
}

/// One shard's view of a shared table. `clone` gives another view of the same table (with
/// its own cache): one per shard.
pub(crate) struct SharedTable<T> {
    published: Arc<Published<T>>,
    /// The generation and snapshot this view read last.
    cached: RefCell<(u64, Arc<T>)>,
}

/// A snapshot being read: the view's cached one, or (a read nested in another that was
/// already using an older cache) a fresh load.
pub(crate) enum Snapshot<'a, T> {
    Cached(Ref<'a, (u64, Arc<T>)>),
    Fresh(Guard<Arc<T>>),
}

impl<T> std::ops::Deref for Snapshot<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Snapshot::Cached(r) => &r.1,
            Snapshot::Fresh(g) => g,
        }
    }
}

impl<T: Default> Default for SharedTable<T> {
    fn default() -> Self {
        let first = Arc::new(T::default());
        SharedTable {
            published: Arc::new(Published {
                current: ArcSwap::new(first.clone()),
                generation: AtomicU64::new(0),
                writer: Mutex::new(()),
            }),
            cached: RefCell::new((0, first)),
        }
    }
}

impl<T> Clone for SharedTable<T> {
    fn clone(&self) -> Self {
        let generation = self.published.generation.load(Ordering::Acquire);
        SharedTable {
            published: self.published.clone(),
            cached: RefCell::new((generation, self.published.current.load_full())),
        }
    }
}

impl<T> fmt::Debug for SharedTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTable")
            .field(
                "generation",
                &self.published.generation.load(Ordering::Relaxed),
            )
            .finish()
    }
}

impl<T: Clone> SharedTable<T> {
    /// The table as last published.
    pub fn read(&self) -> Snapshot<'_, T> {
        let generation = self.published.generation.load(Ordering::Acquire);
        {
            let cached = self.cached.borrow();
            if cached.0 == generation {
                return Snapshot::Cached(cached);
            }
        }
        match self.cached.try_borrow_mut() {
            // Loaded after the generation was read: at least that new.
            Ok(mut cached) => *cached = (generation, self.published.current.load_full()),
            Err(_) => return Snapshot::Fresh(self.published.current.load()),
        }
        Snapshot::Cached(self.cached.borrow())
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let _writer = self.write_lock();
        let mut table = T::clone(&self.published.current.load());
        let out = change(&mut table);
        self.published.current.store(Arc::new(table));
        self.published.generation.fetch_add(1, Ordering::Release);
        out
    }

    /// The publishers' lock, for a change that must not race a publication (binding a
    /// window to a region that is being deregistered).
    pub fn write_lock(&self) -> MutexGuard<'_, ()> {
        self.published
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_sees_a_change_at_its_next_read() {
        let a: SharedTable<Vec<u32>> = SharedTable::default();
        let b = a.clone();
        assert!(b.read().is_empty());
        a.update(|t| t.push(7));
        assert_eq!(*b.read(), vec![7]);
        assert_eq!(*a.read(), vec![7]);
        // A read nested in one that holds the old snapshot gets a fresh load.
        let outer = b.read();
        a.update(|t| t.push(8));
        assert_eq!(*b.read(), vec![7, 8]);
        assert_eq!(*outer, vec![7]);
        drop(outer);
        assert_eq!(*b.read(), vec![7, 8]);
    }
}
