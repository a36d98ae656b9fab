//! The store of recent responses behind `previous_response_id`, `GET` / `DELETE
//! /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`: each finished response
//! (completed or incomplete, with `store`) as its response object's JSON text and its [`Item`]s —
//! the inputs before it, its own inputs, its output — each with its [`Tag`] (id and status) (an item
//! carried over from a stored response keeps both); the last [`STORE_RESPONSES`], each for at most
//! [`STORE_TTL`], at most [`STORE_BYTES`] of text together (oldest dropped first; a response past
//! that alone is not kept).

use super::super::api::responses::OutputItemStatus;
use aubier_runtime::text::chat::Role;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most responses the store keeps.
pub const STORE_RESPONSES: usize = 256;

/// How long the store keeps a response.
pub const STORE_TTL: Duration = Duration::from_secs(60 * 60);

/// Most bytes of text the kept responses hold together.
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
}

impl Stored {
    /// Bytes of text it holds.
    fn bytes(&self) -> usize {
        let items: usize = self.items.iter().map(Item::bytes).sum();
        let ids: usize = self.tags.iter().map(|t| t.id.len()).sum();
        self.response.len() + items + ids
    }
}

/// The recently finished responses (module note).
#[derive(Debug, Default)]
pub struct ResponseStore {
    kept: Mutex<VecDeque<Kept>>,
}

#[derive(Debug)]
struct Kept {
    id: String,
    at: Instant,
    stored: Arc<Stored>,
    bytes: usize,
}

impl ResponseStore {
    /// Drops what is past the store's bounds, oldest first.
    fn prune(kept: &mut VecDeque<Kept>) {
        let mut bytes: usize = kept.iter().map(|k| k.bytes).sum();
        while let Some(oldest) = kept.front() {
            if kept.len() <= STORE_RESPONSES
                && bytes <= STORE_BYTES
                && oldest.at.elapsed() < STORE_TTL
            {
                break;
            }
            bytes -= oldest.bytes;
            kept.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Response `id`, if kept.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let mut kept = self.lock();
        Self::prune(&mut kept);
        kept.iter().find(|k| k.id == id).map(|k| k.stored.clone())
    }

    /// Keeps response `id`, unless it alone is past [`STORE_BYTES`].
    pub fn put(&self, id: String, stored: Stored) {
        let bytes = stored.bytes() + id.len();
        if bytes > STORE_BYTES {
            return;
        }
        let mut kept = self.lock();
        kept.push_back(Kept {
            id,
            at: Instant::now(),
            stored: Arc::new(stored),
            bytes,
        });
        Self::prune(&mut kept);
    }

    /// Drops response `id`; whether it was kept.
    pub fn delete(&self, id: &str) -> bool {
        let mut kept = self.lock();
        Self::prune(&mut kept);
        let before = kept.len();
        kept.retain(|k| k.id != id);
        kept.len() < before
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
}
