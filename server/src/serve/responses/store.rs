//! The store of recent responses behind `previous_response_id`, `item_reference` input items, `GET`
//! / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`: each finished response
//! (completed, incomplete or failed mid-stream, with `store`; a streamed one from its start, in
//! progress, then replaced by its end) as its response object's JSON text and its [`Item`]s — the
//! inputs before it, its own inputs, its output — each with its [`Tag`] (id and status) (an item
//! carried over from a stored response keeps both); the last [`STORE_RESPONSES`], each for at most
//! [`STORE_TTL`], at most [`STORE_BYTES`] together (oldest dropped first; a response past that
//! alone is not kept), counting their text and what each item takes besides (its structs, its
//! id's copies and its index entry), so that a response of many empty items counts its memory.
//!
//! Items are found by id through an index beside the responses: each item id of the kept
//! responses maps to the newest kept response holding it (an item carried over is held by every
//! response that continues its own; one id sent with different items in unrelated requests is
//! the newest's), so a lookup is one hash probe. The index holds one more copy of each distinct
//! item id (counted in its response's bytes). Dropping the oldest response unindexes the ids only it held (a newer holder would
//! be indexed instead); deleting one re-indexes its ids under the newest older response that
//! holds them, if any.

use super::super::api::responses::OutputItemStatus;
use aubier_runtime::text::chat::Role;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most responses the store keeps.
pub const STORE_RESPONSES: usize = 256;

/// How long the store keeps a response.
pub const STORE_TTL: Duration = Duration::from_secs(60 * 60);

/// Most bytes the kept responses hold together: text, ids and each item's bookkeeping.
pub const STORE_BYTES: usize = 64 << 20;

/// One turn of a conversation as the Responses API has it.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// A message: user, system, developer or an earlier answer's text.
    Message {
        /// Its author.
        role: Role,
        /// Its text.
        text: String,
    },
    /// An earlier answer's reasoning.
    Reasoning(String),
    /// A function call of an earlier answer.
    Call {
        /// What its output answers.
        call_id: String,
        /// The function.
        name: String,
        /// The JSON text of the arguments.
        arguments: String,
    },
    /// A function call's result.
    Output {
        /// The call it answers.
        call_id: String,
        /// The result.
        output: String,
    },
}

impl Item {
    /// Bytes of text it holds.
    fn bytes(&self) -> usize {
        match self {
            Item::Message { text, .. } | Item::Reasoning(text) => text.len(),
            Item::Call {
                call_id,
                name,
                arguments,
            } => call_id.len() + name.len() + arguments.len(),
            Item::Output { call_id, output } => call_id.len() + output.len(),
        }
    }
}

/// An item's id and status, as `input_items` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tag {
    /// `msg_…`, `rs_…`, `fc_…` or `fco_…`.
    pub id: String,
    /// `completed`, or `incomplete` for an output item cut off (by `max_output_tokens` or the
    /// context), which stays so where it is carried over.
    pub status: OutputItemStatus,
}

/// One kept response (module note).
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The response object as the route answered it, JSON text.
    pub response: String,
    /// Its conversation: the inputs of the responses before it, its own inputs, its output.
    pub items: Vec<Item>,
    /// The tag of each of `items`, in their order.
    pub tags: Vec<Tag>,
    /// How many of `items` are inputs (the rest is its output).
    pub inputs: usize,
    /// False while it is being generated (streamed: `response` is the object
    /// `response.in_progress` carried, `items` its inputs).
    pub finished: bool,
}

/// What each item costs besides its text and id: its [`Item`] and [`Tag`], its entry in the
/// index (key and [`Holder`]), and the allocator's header of each of its id's two copies.
const ITEM_BOOKKEEPING: usize = std::mem::size_of::<Item>()
    + std::mem::size_of::<Tag>()
    + std::mem::size_of::<(String, Holder)>()
    + 2 * 16;

impl Stored {
    /// Bytes it holds: its text, each item's id twice (its tag and the index's copy) and
    /// [`ITEM_BOOKKEEPING`], so that many small items count what they take.
    fn bytes(&self) -> usize {
        let items: usize = self.items.iter().map(Item::bytes).sum();
        let ids: usize = self.tags.iter().map(|t| 2 * t.id.len()).sum();
        self.response.len() + items + ids + self.items.len() * ITEM_BOOKKEEPING
    }
}

/// The recently finished responses and their items by id (module note).
#[derive(Debug, Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Oldest first.
    kept: VecDeque<Kept>,
    /// Each item id of `kept`: the newest response holding it.
    items: HashMap<String, Holder>,
    /// The responses deleted while in progress whose stream has not ended: their end is not
    /// kept ([`ResponseStore::update`]); at most one per stream in progress.
    deleted: HashSet<String>,
}

#[derive(Debug)]
struct Kept {
    id: String,
    at: Instant,
    stored: Arc<Stored>,
    bytes: usize,
}

/// Where an item is: its response and its index in the response's items.
#[derive(Debug)]
struct Holder {
    stored: Arc<Stored>,
    index: usize,
}

impl Inner {
    /// Indexes `stored`'s items under it.
    fn index(&mut self, stored: &Arc<Stored>) {
        for (index, tag) in stored.tags.iter().enumerate() {
            let holder = Holder {
                stored: stored.clone(),
                index,
            };
            self.items.insert(tag.id.clone(), holder);
        }
    }

    /// Removes the index entries that point into `gone`; their ids.
    fn unindex(&mut self, gone: &Arc<Stored>) -> HashSet<String> {
        let mut ids = HashSet::new();
        for tag in &gone.tags {
            if let Some(h) = self.items.get(&tag.id) {
                if Arc::ptr_eq(&h.stored, gone) {
                    self.items.remove(&tag.id);
                    ids.insert(tag.id.clone());
                }
            }
        }
        ids
    }

    /// Drops what is past the store's bounds, oldest first.
    fn prune(&mut self) {
        let mut bytes: usize = self.kept.iter().map(|k| k.bytes).sum();
        while let Some(oldest) = self.kept.front() {
            if self.kept.len() <= STORE_RESPONSES
                && bytes <= STORE_BYTES
                && oldest.at.elapsed() < STORE_TTL
            {
                break;
            }
            bytes -= oldest.bytes;
            if let Some(oldest) = self.kept.pop_front() {
                // No newer response holds the ids that point here: it would be indexed.
                self.unindex(&oldest.stored);
            }
        }
    }
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.prune();
        inner
    }

    /// Response `id`, if kept.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let inner = self.lock();
        let found = inner.kept.iter().find(|k| k.id == id);
        found.map(|k| k.stored.clone())
    }

    /// The item listed under `id` in a kept response (input or output), with its tag.
    pub fn item(&self, id: &str) -> Option<(Tag, Item)> {
        let inner = self.lock();
        let h = inner.items.get(id)?;
        Some((
            h.stored.tags[h.index].clone(),
            h.stored.items[h.index].clone(),
        ))
    }

    /// Keeps response `id`, unless it alone is past [`STORE_BYTES`].
    pub fn put(&self, id: String, stored: Stored) {
        self.lock().push(id, stored);
    }

    /// Keeps `stored`, the end of streamed response `id`, as the newest in place of its entry
    /// in progress (unless past [`STORE_BYTES`] alone), unless `id` was deleted since; an entry
    /// dropped by the bounds since (newer responses finished while it streamed) does not stop
    /// it, as a response that was not streamed is kept when it ends.
    pub fn update(&self, id: String, stored: Stored) {
        let mut inner = self.lock();
        if inner.deleted.remove(&id) {
            return;
        }
        inner.remove(&id);
        inner.push(id, stored);
    }

    /// Drops response `id`; whether it was kept. Its items stay findable where an older kept
    /// response holds them too. One in progress stays deleted when its stream ends.
    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let Some(gone) = inner.remove(id) else {
            return false;
        };
        if !gone.finished {
            inner.deleted.insert(id.to_owned());
        }
        true
    }

    /// Forgets streamed response `id`, whose stream ended before the response did (its client
    /// went away).
    pub fn forget(&self, id: &str) {
        let mut inner = self.lock();
        inner.deleted.remove(id);
        inner.remove(id);
    }
}

impl Inner {
    /// [`ResponseStore::put`].
    fn push(&mut self, id: String, stored: Stored) {
        let bytes = stored.bytes() + id.len();
        if bytes > STORE_BYTES {
            return;
        }
        let stored = Arc::new(stored);
        self.index(&stored);
        self.kept.push_back(Kept {
            id,
            at: Instant::now(),
            stored,
            bytes,
        });
        self.prune();
    }

    /// Drops response `id` ([`ResponseStore::delete`]); what it was, if kept.
    fn remove(&mut self, id: &str) -> Option<Arc<Stored>> {
        let at = self.kept.iter().position(|k| k.id == id)?;
        let gone = self.kept.remove(at)?;
        let mut orphans = self.unindex(&gone.stored);
        // Newer responses do not hold the orphans (they would be indexed): the older ones,
        // newest first.
        for k in self.kept.range(..at).rev() {
            if orphans.is_empty() {
                break;
            }
            for (index, tag) in k.stored.tags.iter().enumerate() {
                if orphans.remove(&tag.id) {
                    let holder = Holder {
                        stored: k.stored.clone(),
                        index,
                    };
                    self.items.insert(tag.id.clone(), holder);
                }
            }
        }
        Some(gone.stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(text: &str) -> Stored {
        Stored {
            response: "{}".to_owned(),
            items: vec![Item::Message {
                role: Role::User,
                text: text.to_owned(),
            }],
            tags: vec![Tag {
                id: "msg_1".to_owned(),
                status: OutputItemStatus::Completed,
            }],
            inputs: 1,
            finished: true,
        }
    }

    #[test]
    fn the_store_keeps_the_last_responses_within_its_bytes() {
        let store = ResponseStore::default();
        for i in 0..STORE_RESPONSES + 10 {
            store.put(format!("resp_{i}"), said("x"));
        }
        assert!(store.get("resp_9").is_none());
        assert_eq!(store.get("resp_10").as_deref(), Some(&said("x")));
        let last = format!("resp_{}", STORE_RESPONSES + 9);
        assert!(store.get(&last).is_some());
        store.put("big".to_owned(), said(&"y".repeat(STORE_BYTES)));
        assert!(store.get("big").is_none(), "past the byte bound alone");
        assert!(store.get(&last).is_some(), "the newer ones stay");
    }

    #[test]
    fn a_deleted_response_is_gone_and_the_others_stay() {
        let store = ResponseStore::default();
        store.put("resp_a".to_owned(), said("a"));
        store.put("resp_b".to_owned(), said("b"));
        assert!(store.delete("resp_a"));
        assert!(store.get("resp_a").is_none());
        assert!(!store.delete("resp_a"), "deleted once");
        assert_eq!(store.get("resp_b").as_deref(), Some(&said("b")));
    }

    /// A response in progress: `said(text)` not finished.
    fn streaming(text: &str) -> Stored {
        Stored {
            finished: false,
            ..said(text)
        }
    }

    #[test]
    fn an_update_replaces_a_kept_response_and_not_a_deleted_one() {
        let store = ResponseStore::default();
        store.put("resp_a".to_owned(), streaming("a"));
        store.update("resp_a".to_owned(), said("b"));
        assert_eq!(store.get("resp_a").as_deref(), Some(&said("b")));
        assert_eq!(store.lock().kept.len(), 1, "replaced, not added");
        store.put("resp_b".to_owned(), streaming("a"));
        assert!(store.delete("resp_b"));
        store.update("resp_b".to_owned(), said("c"));
        assert!(store.get("resp_b").is_none(), "deleted before the update");
        assert!(store.lock().deleted.is_empty(), "the stream ended");
        store.put("resp_c".to_owned(), streaming("a"));
        assert!(store.delete("resp_c"));
        store.forget("resp_c");
        assert!(store.lock().deleted.is_empty(), "its client went away");
    }

    /// A stream that outlives the store's bound of responses (newer ones finished while it
    /// streamed) is kept when it ends, as a response that was not streamed is: its end once
    /// found its entry in progress dropped and was not kept.
    #[test]
    fn a_stream_outlived_by_the_bounds_is_kept_at_its_end() {
        let store = ResponseStore::default();
        store.put("resp_long".to_owned(), streaming("a"));
        for i in 0..STORE_RESPONSES {
            store.put(format!("resp_{i}"), said("x"));
        }
        assert!(store.get("resp_long").is_none(), "dropped in progress");
        store.update("resp_long".to_owned(), said("b"));
        assert_eq!(store.get("resp_long").as_deref(), Some(&said("b")));
        assert!(store.get("resp_0").is_none(), "the oldest went instead");
    }

    /// A client's many tiny items (empty text, short ids) count what they take, not only their
    /// few bytes of text: 55,000 of them in a body once counted 5 bytes each and took over 200,
    /// so a store "of 64 MiB" grew to 2 GiB.
    #[test]
    fn tiny_items_count_their_bookkeeping() {
        let n = 1000;
        let stored = Stored {
            response: String::new(),
            items: vec![Item::Reasoning(String::new()); n],
            tags: (0..n)
                .map(|i| Tag {
                    id: i.to_string(),
                    status: OutputItemStatus::Completed,
                })
                .collect(),
            inputs: n,
            finished: true,
        };
        let structs = std::mem::size_of::<Item>()
            + std::mem::size_of::<Tag>()
            + std::mem::size_of::<(String, Holder)>();
        assert!(
            stored.bytes() >= n * structs,
            "{} bytes for {n} items of {structs} bytes each",
            stored.bytes()
        );
    }

    /// A conversation of messages tagged `ids`, the last one its output.
    fn tagged(ids: &[&str]) -> Stored {
        Stored {
            response: "{}".to_owned(),
            items: ids
                .iter()
                .map(|id| Item::Message {
                    role: Role::User,
                    text: format!("text of {id}"),
                })
                .collect(),
            tags: ids
                .iter()
                .map(|id| Tag {
                    id: (*id).to_owned(),
                    status: OutputItemStatus::Completed,
                })
                .collect(),
            inputs: ids.len() - 1,
            finished: true,
        }
    }

    fn text(store: &ResponseStore, id: &str) -> Option<String> {
        match store.item(id) {
            Some((tag, Item::Message { text, .. })) => {
                assert_eq!(tag.id, id);
                Some(text)
            }
            _ => None,
        }
    }

    #[test]
    fn items_are_found_by_id_while_a_response_holds_them() {
        let store = ResponseStore::default();
        store.put("resp_a".to_owned(), tagged(&["msg_1", "msg_2"]));
        store.put(
            "resp_b".to_owned(),
            tagged(&["msg_1", "msg_2", "msg_3", "msg_4"]),
        );
        store.put("resp_c".to_owned(), tagged(&["msg_5", "msg_6"]));
        assert_eq!(text(&store, "msg_2").as_deref(), Some("text of msg_2"));
        assert_eq!(text(&store, "msg_9"), None);
        assert!(store.delete("resp_b"));
        assert!(text(&store, "msg_1").is_some(), "resp_a holds it still");
        assert_eq!(text(&store, "msg_3"), None, "only resp_b held it");
        assert!(store.delete("resp_a"));
        assert_eq!(text(&store, "msg_1"), None);
        assert!(text(&store, "msg_6").is_some());
        for i in 0..STORE_RESPONSES {
            store.put(format!("resp_{i}"), said("x"));
        }
        assert_eq!(text(&store, "msg_6"), None, "resp_c was dropped");
        assert_eq!(
            store.inner.lock().expect("lock").items.len(),
            1,
            "msg_1 alone"
        );
    }
}
