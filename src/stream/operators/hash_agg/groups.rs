//! The groups an aggregation holds in memory (`Cached`), each in a place of a slab and found
//! by key through a hash table of places: a key is stored once and hashed once per row, and
//! the barrier reaches the epoch's groups by place, without hashing their keys again.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use super::Cached;

/// A group's place in the slab.
pub(super) type Place = u32;

struct Slot {
    key: Vec<u8>,
    group: Cached,
    /// The chunk it was last used in.
    used: u64,
}

#[derive(Default)]
pub(super) struct Groups {
    places: HashTable<Place>,
    slots: Vec<Option<Slot>>,
    /// Places whose group was removed, to be used again.
    free: Vec<Place>,
    hasher: RandomState,
    /// Chunks seen, the clock of `Slot::used`.
    clock: u64,
}

impl Groups {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Marks the start of a chunk: what is used from now on is more recent than before.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// The place of the group `key`: held, or made by `load` and held from now on.
    pub fn find_or_load(
        &mut self,
        key: &[u8],
        load: impl FnOnce() -> crate::error::Result<Cached>,
    ) -> crate::error::Result<Place> {
        let hash = self.hasher.hash_one(key);
        let Groups {
            places,
            slots,
            free,
            hasher,
            clock,
        } = self;
        let entry = places.entry(
            hash,
            |&p| slot_key(slots, p) == key,
            |&p| hasher.hash_one(slot_key(slots, p)),
        );
        match entry {
            Entry::Occupied(entry) => {
                let place = *entry.get();
                if let Some(Some(slot)) = slots.get_mut(place as usize) {
                    slot.used = *clock;
                }
                Ok(place)
            }
            Entry::Vacant(entry) => {
                let slot = Slot {
                    key: key.to_vec(),
                    group: load()?,
                    used: *clock,
                };
                let place = match free.pop() {
                    Some(place) => {
                        slots[place as usize] = Some(slot);
                        place
                    }
                    None => {
                        slots.push(Some(slot));
                        Place::try_from(slots.len() - 1).expect("fewer than 2^32 groups held")
                    }
                };
                entry.insert(place);
                Ok(place)
            }
        }
    }

    /// The group at `place`, unless it was removed.
    pub fn get(&self, place: Place) -> Option<&Cached> {
        self.slots.get(place as usize)?.as_ref().map(|s| &s.group)
    }

    pub fn get_mut(&mut self, place: Place) -> Option<&mut Cached> {
        self.slots
            .get_mut(place as usize)?
            .as_mut()
            .map(|s| &mut s.group)
    }

    /// The key of the group at `place` (empty when it was removed).
    pub fn key(&self, place: Place) -> &[u8] {
        slot_key(&self.slots, place)
    }

    /// Removes the group at `place`; its place may hold another group from now on.
    pub fn remove(&mut self, place: Place) -> Option<Cached> {
        let hash = self.hasher.hash_one(self.key(place));
        let entry = self.places.find_entry(hash, |&p| p == place).ok()?;
        entry.remove();
        let slot = self.slots[place as usize].take()?;
        self.free.push(place);
        Some(slot.group)
    }

    #[cfg(test)]
    pub fn clear(&mut self) {
        self.places.clear();
        self.slots.clear();
        self.free.clear();
    }

    /// Removes the groups `keep` says no to, given each one's key, group and last use.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &Cached, u64) -> bool) {
        let Groups {
            places,
            slots,
            free,
            ..
        } = self;
        places.retain(|&mut place| {
            let Some(Some(slot)) = slots.get(place as usize) else {
                return false;
            };
            if keep(&slot.key, &slot.group, slot.used) {
                return true;
            }
            slots[place as usize] = None;
            free.push(place);
            false
        });
    }

    /// Every group held with its last use.
    pub fn uses(&self) -> impl Iterator<Item = (&Cached, u64)> {
        self.slots.iter().flatten().map(|s| (&s.group, s.used))
    }

    /// Every group held, with its key.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Cached)> {
        self.slots
            .iter()
            .flatten()
            .map(|s| (s.key.as_slice(), &s.group))
    }
}

fn slot_key(slots: &[Option<Slot>], place: Place) -> &[u8] {
    match slots.get(place as usize) {
        Some(Some(slot)) => &slot.key,
        _ => &[],
    }
}
