//! What a command is doing while it works long: the display of the steps the runtime reports
//! ([`Progress`]: a model's load, with the backend's weight copies, uploads and shader builds; a
//! session's opening, with the fast store's fill) and of `aubier replay`'s runs ([`Steps`]), and
//! of `aubier synth`'s write ([`ByteProgress`]).
//! On a terminal an indicatif spinner naming the step, a bar for a counted one; otherwise one
//! stderr line per step as it ends, with its count and the time it took.

use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::progress::{Count, Progress};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::StoreOptions;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The terminal style of a step that counts `count`.
fn style(count: Count) -> ProgressStyle {
    let template = match count {
        Count::Time => "{spinner} {prefix}: {msg} ({elapsed})",
        Count::Bytes(_) => {
            "{prefix}: {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta} left)"
        }
        Count::Items(..) => "{prefix}: {msg} [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)",
    };
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// How much a step counts, as a line says it (`1.20 GiB`, `40 shaders`); `None` for time alone.
fn amount(count: Count) -> Option<String> {
    match count {
        Count::Time => None,
        Count::Bytes(n) => Some(HumanBytes(n).to_string()),
        Count::Items(n, what) => Some(format!("{n} {what}")),
    }
}

/// A display of work made of steps, the prefix of every line naming the work.
pub struct Steps {
    what: String,
    bar: Option<ProgressBar>,
    /// One bar over all steps (each step then names the part in progress), else a bar per step.
    whole: bool,
    current: Option<(String, Count, Instant)>,
    start: Instant,
}

impl Steps {
    /// A display of `what`, each counted step with a bar of its own (until [`Steps::whole`]).
    pub fn new(what: &str) -> Steps {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(style(Count::Time));
            b.set_prefix(what.to_string());
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        Steps {
            what: what.to_string(),
            bar,
            whole: false,
            current: None,
            start: Instant::now(),
        }
    }

    /// The display of loading the model file at `path`.
    pub fn load(path: &Path) -> Steps {
        Steps::new(&format!("loading {}", path.display()))
    }

    /// From here on one bar over the rest of the work, `whole`: each step then names the part
    /// in progress, its own count for its line alone, and [`Progress::advance`] moves the
    /// whole bar.
    pub fn whole(&mut self, whole: Count) {
        self.whole = true;
        if let Some(b) = &self.bar {
            b.set_style(style(whole));
            b.set_length(total(whole));
            b.reset();
        }
    }

    /// Ends the last step and says the whole work was `done` (`loaded`) and in how long.
    pub fn done(mut self, done: &str) {
        self.end_step();
        let total = self.start.elapsed().as_secs_f64();
        match self.bar.take() {
            Some(b) => {
                if let Ok(style) = ProgressStyle::with_template("{prefix}: {msg}") {
                    b.set_style(style);
                }
                b.finish_with_message(format!("{done} in {total:.1} s"));
            }
            None => eprintln!("{}: {done} in {total:.2} s", self.what),
        }
    }

    fn end_step(&mut self) {
        if let (None, Some((what, count, at))) = (&self.bar, self.current.take()) {
            let s = at.elapsed().as_secs_f64();
            match amount(count) {
                Some(n) => eprintln!("{}: {what} ({n}) took {s:.2} s", self.what),
                None => eprintln!("{}: {what} took {s:.2} s", self.what),
            }
        }
    }
}

/// Opens a session on `model` ([`Session::open_observed`]), showing its steps (the latent
/// cache, the fast store's fill) as `opening a session`.
///
/// Errors: those of [`Session::open_observed`].
pub fn open_session(
    model: Arc<Model>,
    opts: SessionOptions,
    store: &StoreOptions,
) -> Result<Session, EngineError> {
    let mut progress = Steps::new("opening a session");
    let session = Session::open_observed(model, opts, store, &mut progress)?;
    progress.done("opened");
    Ok(session)
}

/// The total of `count` (0 for time alone).
fn total(count: Count) -> u64 {
    match count {
        Count::Time => 0,
        Count::Bytes(n) | Count::Items(n, _) => n,
    }
}

impl Progress for Steps {
    fn step(&mut self, what: &str, count: Count) {
        self.end_step();
        if let Some(b) = &self.bar {
            if !self.whole {
                b.set_style(style(count));
                b.set_length(total(count));
                b.reset();
            }
            b.set_message(what.to_string());
        }
        self.current = Some((what.to_string(), count, Instant::now()));
    }

    fn advance(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }
}

impl Drop for Steps {
    /// Work that failed leaves no bar behind.
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Progress of a long write counted in bytes (`aubier synth`): on a terminal an indicatif bar
/// with the rate and the time left; otherwise a stderr line at each tenth of the total with the
/// time so far.
pub struct ByteProgress {
    what: String,
    total: u64,
    done: u64,
    bar: Option<ProgressBar>,
    tenths: u64,
    start: Instant,
}

impl ByteProgress {
    /// A display for `total` bytes of `what`.
    pub fn new(what: &str, total: u64) -> ByteProgress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            b.set_style(style(Count::Bytes(total)));
            b.set_prefix(what.to_string());
            b
        });
        ByteProgress {
            what: what.to_string(),
            total,
            done: 0,
            bar,
            tenths: 0,
            start: Instant::now(),
        }
    }

    /// `bytes` more are done.
    pub fn add(&mut self, bytes: u64) {
        self.done = (self.done + bytes).min(self.total);
        if let Some(b) = &self.bar {
            b.set_position(self.done);
            return;
        }
        let tenths = (self.done * 10).checked_div(self.total).unwrap_or(10);
        if tenths > self.tenths {
            self.tenths = tenths;
            eprintln!(
                "{}: {}0 % ({:.2} of {:.2} GB) after {:.1} s",
                self.what,
                tenths,
                self.done as f64 / 1e9,
                self.total as f64 / 1e9,
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

impl Drop for ByteProgress {
    /// The bar is cleared whether the write ended or failed.
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
