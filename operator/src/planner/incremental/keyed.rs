//! Objects in a `Vec` (the shape [`super::super::World`] takes, so a full pass borrows them
//! without a copy) with an index by key.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

pub(crate) struct Keyed<K, T> {
    items: Vec<T>,
    index: HashMap<K, usize>,
    key_of: fn(&T) -> K,
}

impl<K: Hash + Eq + Clone, T> Keyed<K, T> {
    pub fn new(key_of: fn(&T) -> K) -> Self {
        Self {
            items: Vec::new(),
            index: HashMap::new(),
            key_of,
        }
    }

    // Looked up by a borrowed key (`&str` for a `String`): an event's lookups build no key.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&T>
    where
        K: Borrow<Q>,
    {
        self.index.get(key).map(|&i| &self.items[i])
    }

    /// Where `key`'s object sits in the `Vec` (also while lent).
    pub fn position<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
    {
        self.index.get(key).copied()
    }

    pub fn contains_key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.index.contains_key(key)
    }

    /// Insert or replace (in place); returns the object replaced.
    pub fn insert(&mut self, item: T) -> Option<T> {
        let key = (self.key_of)(&item);
        match self.index.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut self.items[i], item)),
            None => {
                self.index.insert(key, self.items.len());
                self.items.push(item);
                None
            }
        }
    }

    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<T>
    where
        K: Borrow<Q>,
    {
        let i = self.index.remove(key)?;
        let item = self.items.swap_remove(i);
        if let Some(moved) = self.items.get(i) {
            self.index.insert((self.key_of)(moved), i);
        }
        Some(item)
    }

    pub fn values(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Replace every object.
    pub fn replace(&mut self, items: Vec<T>) {
        self.items.clear();
        self.index.clear();
        for item in items {
            self.insert(item);
        }
    }

    /// Lend the objects out as a `Vec`; [`Self::put_back`] must return the same `Vec`, unchanged.
    pub fn lend(&mut self) -> Vec<T> {
        std::mem::take(&mut self.items)
    }

    pub fn put_back(&mut self, items: Vec<T>) {
        debug_assert_eq!(items.len(), self.index.len());
        self.items = items;
    }
}
