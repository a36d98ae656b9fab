//! The store of recent responses behind `previous_response_id`: each finished response (completed
//! or incomplete, with `store`) as its [`Item`]s — its inputs, the inputs before it, its output —
//! the last [`STORE_RESPONSES`], each for at most [`STORE_TTL`], at most [`STORE_BYTES`] of text
//! together (oldest dropped first; a response past that alone is not kept).

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

/// The recently finished responses, as their items (module note).
#[derive(Debug, Default)]
pub struct ResponseStore {
    kept: Mutex<VecDeque<Kept>>,
}

#[derive(Debug)]
struct Kept {
    id: String,
    at: Instant,
    items: Arc<Vec<Item>>,
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

    /// The items of response `id` (its inputs and its output), if kept.
    pub fn get(&self, id: &str) -> Option<Arc<Vec<Item>>> {
        let mut kept = self.lock();
        Self::prune(&mut kept);
        kept.iter().find(|k| k.id == id).map(|k| k.items.clone())
    }

    /// Keeps response `id` as `items`, unless they alone are past [`STORE_BYTES`].
    pub fn put(&self, id: String, items: Vec<Item>) {
        let bytes = items.iter().map(Item::bytes).sum::<usize>() + id.len();
        if bytes > STORE_BYTES {
            return;
        }
        let mut kept = self.lock();
        kept.push_back(Kept {
            id,
            at: Instant::now(),
            items: Arc::new(items),
            bytes,
        });
        Self::prune(&mut kept);
    }
}
