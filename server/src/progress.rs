//! What a command is doing while it loads a model: on a terminal an indicatif spinner naming the
//! phase ([`LoadPhase::describe`]) with the time spent; otherwise one line per phase on stderr
//! with the time it took, as it ends.

use aubier_runtime::engine::LoadPhase;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// The load display of one model file.
pub struct LoadProgress {
    /// What is loaded (the file), the prefix of every line.
    what: String,
    bar: Option<ProgressBar>,
    current: Option<(LoadPhase, Instant)>,
    start: Instant,
}

impl LoadProgress {
    /// A display for loading `what`: a spinner when stderr is a terminal, else lines.
    pub fn new(what: &str) -> LoadProgress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {prefix}: {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.set_prefix(format!("loading {what}"));
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        LoadProgress {
            what: what.to_string(),
            bar,
            current: None,
            start: Instant::now(),
        }
    }

    /// Ends the current phase (its line, off a terminal) and starts `phase`.
    pub fn phase(&mut self, phase: LoadPhase) {
        self.end_phase();
        if let Some(b) = &self.bar {
            b.set_message(phase.describe());
        }
        self.current = Some((phase, Instant::now()));
    }

    /// Ends the last phase and says how long the whole load took.
    pub fn done(mut self) {
        self.end_phase();
        let total = self.start.elapsed().as_secs_f64();
        match self.bar.take() {
            Some(b) => {
                if let Ok(style) = ProgressStyle::with_template("{prefix}: {msg}") {
                    b.set_style(style);
                }
                b.finish_with_message(format!("loaded in {total:.1} s"));
            }
            None => eprintln!("loading {}: loaded in {total:.2} s", self.what),
        }
    }

    fn end_phase(&mut self) {
        if let (None, Some((phase, at))) = (&self.bar, self.current.take()) {
            let s = at.elapsed().as_secs_f64();
            eprintln!("loading {}: {} took {s:.2} s", self.what, phase.describe());
        }
    }
}

impl Drop for LoadProgress {
    /// A load that failed leaves no spinner behind.
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
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta} left)",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
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
