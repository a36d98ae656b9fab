//! Routing traces: the experts each token routed to, per MoE layer, as JSON lines.
//!
//! Format (fixed; traces recorded from other models are replayed too): one JSON object per line,
//! in token order,
//!
//! ```text
//! {"seq": 0, "pos": 17, "n_experts": 128, "top_k": 4, "layers": [[5, 90, 3, 17], …]}
//! ```
//!
//! `seq` numbers the sequence (request), `pos` is the token's position in it, `layers[l]` lists the
//! `top_k` distinct experts layer `l` routed the token to (in the router's order). Every line has the
//! same `n_experts`, `top_k` and number of layers. Other fields are ignored on read; whitespace-only
//! lines are skipped. Reading parses each line into a `serde_json::Value` and checks each field by
//! hand, so an error names the 1-based line and the field (`layers[2][3]`), never a panic.

use serde::Serialize;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// One line of a trace: one token's routing in every layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceRecord {
    /// Sequence (request) number.
    pub seq: u64,
    /// Position of the token in its sequence (0-based).
    pub pos: u64,
    /// Routed experts per layer (128 for Mistral Small 4).
    pub n_experts: u32,
    /// Experts per token per layer (4 for Mistral Small 4).
    pub top_k: u32,
    /// `[n_layers][top_k]` row-major: the experts each layer routed this token to.
    pub layers: Vec<Vec<u32>>,
}

/// Errors of reading, building or writing a trace. `line` is the 1-based line of the JSONL file (the
/// record's index + 1 when built in memory).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Reading or writing failed (including a line that is not UTF-8).
    #[error("trace line {line}: {source}")]
    Io {
        /// 1-based line.
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The line is not valid JSON.
    #[error("trace line {line}: invalid JSON: {source}")]
    Json {
        /// 1-based line.
        line: usize,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The line is JSON but not an object.
    #[error("trace line {line}: not a JSON object")]
    NotObject {
        /// 1-based line.
        line: usize,
    },
    /// A required field is absent.
    #[error("trace line {line}: missing field `{field}`")]
    Missing {
        /// 1-based line.
        line: usize,
        /// `seq`, `pos`, `n_experts`, `top_k` or `layers`.
        field: &'static str,
    },
    /// A field has the wrong JSON type or an unrepresentable value.
    #[error("trace line {line}: field `{field}`: expected {expected}, got {got}")]
    Type {
        /// 1-based line.
        line: usize,
        /// The field, e.g. `top_k` or `layers[2]`.
        field: String,
        /// What the format requires.
        expected: &'static str,
        /// The value found (shortened).
        got: String,
    },
    /// `n_experts` is 0, or `top_k` is not in `1..=n_experts`.
    #[error(
        "trace line {line}: top_k = {top_k} must be in 1..=n_experts (n_experts = {n_experts})"
    )]
    TopK {
        /// 1-based line.
        line: usize,
        /// The line's `n_experts`.
        n_experts: u32,
        /// The line's `top_k`.
        top_k: u32,
    },
    /// `layers` is an empty list.
    #[error("trace line {line}: field `layers` is empty")]
    NoLayers {
        /// 1-based line.
        line: usize,
    },
    /// A header field differs from the first record's.
    #[error("trace line {line}: field `{field}` is {got}, but the first record has {expected}")]
    Header {
        /// 1-based line.
        line: usize,
        /// `n_experts`, `top_k` or `layers` (its length).
        field: &'static str,
        /// This line's value.
        got: u64,
        /// The first record's value.
        expected: u64,
    },
    /// A layer's row does not hold `top_k` ids (a ragged trace).
    #[error("trace line {line}: layers[{layer}] has {len} expert ids, expected top_k = {top_k}")]
    RowLength {
        /// 1-based line.
        line: usize,
        /// 0-based layer.
        layer: usize,
        /// Ids in the row.
        len: usize,
        /// The trace's `top_k`.
        top_k: u32,
    },
    /// An expert id is not below `n_experts`.
    #[error("trace line {line}: layers[{layer}][{index}] = {expert} is not below n_experts = {n_experts}")]
    ExpertOutOfRange {
        /// 1-based line.
        line: usize,
        /// 0-based layer.
        layer: usize,
        /// 0-based index in the row.
        index: usize,
        /// The id.
        expert: u64,
        /// The trace's `n_experts`.
        n_experts: u32,
    },
    /// A layer's row lists an expert twice (a top-k never does).
    #[error("trace line {line}: layers[{layer}] lists expert {expert} twice")]
    Duplicate {
        /// 1-based line.
        line: usize,
        /// 0-based layer.
        layer: usize,
        /// The repeated id.
        expert: u32,
    },
    /// The trace has no records.
    #[error("the trace has no records")]
    Empty,
}

/// A whole trace in memory: `tokens × n_layers × top_k` expert ids, row-major
/// `[token][layer][k]`, plus each token's `seq` and `pos`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    n_experts: u32,
    top_k: u32,
    n_layers: usize,
    seq: Vec<u64>,
    pos: Vec<u64>,
    ids: Vec<u32>,
}

impl Trace {
    /// Builds a trace from records, checked as the reader checks lines (record `i` reports line
    /// `i + 1`). Errors: every [`TraceError`] variant about content, and `Empty`.
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a TraceRecord>,
    ) -> Result<Trace, TraceError> {
        let mut trace: Option<Trace> = None;
        for (i, r) in records.into_iter().enumerate() {
            push_checked(&mut trace, r, i + 1)?;
        }
        trace.ok_or(TraceError::Empty)
    }

    /// Reads a JSONL trace file. Errors: `Open`, and those of [`Trace::from_reader`].
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let file = std::fs::File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Trace::from_reader(BufReader::new(file))
    }

    /// Reads JSONL trace text. Errors: any [`TraceError`] except `Open`, naming the first bad line.
    pub fn from_reader(reader: impl BufRead) -> Result<Trace, TraceError> {
        let mut trace: Option<Trace> = None;
        for (i, text) in reader.lines().enumerate() {
            let line = i + 1;
            let text = text.map_err(|source| TraceError::Io { line, source })?;
            if text.trim().is_empty() {
                continue;
            }
            let record = parse_line(&text, line)?;
            push_checked(&mut trace, &record, line)?;
        }
        trace.ok_or(TraceError::Empty)
    }

    /// Writes the trace as JSONL, one record per line. Errors: `Io`.
    pub fn write_to(&self, writer: impl Write) -> Result<(), TraceError> {
        let mut w = TraceWriter::new(writer);
        for t in 0..self.tokens() {
            if let Some(record) = self.record(t) {
                w.write(&record)?;
            }
        }
        w.flush()
    }

    /// Routed experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.n_experts
    }

    /// Experts per token per layer.
    pub fn top_k(&self) -> u32 {
        self.top_k
    }

    /// MoE layers in each record.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// Tokens (records).
    pub fn tokens(&self) -> usize {
        self.seq.len()
    }

    /// Routed (token, layer, expert) slots: `tokens × n_layers × top_k`.
    pub fn routed_slots(&self) -> u64 {
        self.ids.len() as u64
    }

    /// The `top_k` experts `token` routed to in `layer`; `None` when either is out of range.
    pub fn experts(&self, token: usize, layer: usize) -> Option<&[u32]> {
        if token >= self.tokens() || layer >= self.n_layers {
            return None;
        }
        let k = self.top_k as usize;
        let start = (token * self.n_layers + layer) * k;
        self.ids.get(start..start + k)
    }

    /// The steps of one layer in token order (each the token's `top_k` experts); `None` when
    /// `layer ≥ n_layers`.
    pub fn layer_steps(&self, layer: usize) -> Option<impl Iterator<Item = &[u32]> + Clone + '_> {
        (layer < self.n_layers)
            .then(|| (0..self.tokens()).filter_map(move |t| self.experts(t, layer)))
    }

    /// The sequence number of every token, `[tokens]` in token order.
    pub fn seqs(&self) -> &[u64] {
        &self.seq
    }

    /// The position of every token in its sequence, `[tokens]` in token order.
    pub fn positions(&self) -> &[u64] {
        &self.pos
    }

    /// Token `token` as a record; `None` when out of range.
    pub fn record(&self, token: usize) -> Option<TraceRecord> {
        let layers = (0..self.n_layers)
            .map(|l| self.experts(token, l).map(<[u32]>::to_vec))
            .collect::<Option<Vec<_>>>()?;
        Some(TraceRecord {
            seq: *self.seq.get(token)?,
            pos: *self.pos.get(token)?,
            n_experts: self.n_experts,
            top_k: self.top_k,
            layers,
        })
    }
}

/// Checks `r` on its own and against the trace so far (its first record's header), then appends it.
fn push_checked(trace: &mut Option<Trace>, r: &TraceRecord, line: usize) -> Result<(), TraceError> {
    check_record(r, line)?;
    let t = trace.get_or_insert_with(|| Trace {
        n_experts: r.n_experts,
        top_k: r.top_k,
        n_layers: r.layers.len(),
        seq: Vec::new(),
        pos: Vec::new(),
        ids: Vec::new(),
    });
    for (field, got, expected) in [
        ("n_experts", r.n_experts as u64, t.n_experts as u64),
        ("top_k", r.top_k as u64, t.top_k as u64),
        ("layers", r.layers.len() as u64, t.n_layers as u64),
    ] {
        if got != expected {
            return Err(TraceError::Header {
                line,
                field,
                got,
                expected,
            });
        }
    }
    t.seq.push(r.seq);
    t.pos.push(r.pos);
    for row in &r.layers {
        t.ids.extend_from_slice(row);
    }
    Ok(())
}

/// Checks one record on its own: `top_k` in range, layers present, rows of `top_k` distinct ids
/// below `n_experts`.
fn check_record(r: &TraceRecord, line: usize) -> Result<(), TraceError> {
    if r.top_k == 0 || r.top_k > r.n_experts {
        return Err(TraceError::TopK {
            line,
            n_experts: r.n_experts,
            top_k: r.top_k,
        });
    }
    if r.layers.is_empty() {
        return Err(TraceError::NoLayers { line });
    }
    for (layer, row) in r.layers.iter().enumerate() {
        if row.len() != r.top_k as usize {
            return Err(TraceError::RowLength {
                line,
                layer,
                len: row.len(),
                top_k: r.top_k,
            });
        }
        for (index, &e) in row.iter().enumerate() {
            if e >= r.n_experts {
                return Err(TraceError::ExpertOutOfRange {
                    line,
                    layer,
                    index,
                    expert: e as u64,
                    n_experts: r.n_experts,
                });
            }
            if row[..index].contains(&e) {
                return Err(TraceError::Duplicate {
                    line,
                    layer,
                    expert: e,
                });
            }
        }
    }
    Ok(())
}

/// A JSON value for an error message, cut to 40 characters.
fn shorten(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s,
    }
}

/// Parses one line into a record, checking the JSON types of the fields (not their ranges).
fn parse_line(text: &str, line: usize) -> Result<TraceRecord, TraceError> {
    let value: Value =
        serde_json::from_str(text).map_err(|source| TraceError::Json { line, source })?;
    let obj = value.as_object().ok_or(TraceError::NotObject { line })?;
    let field = |name: &'static str| {
        obj.get(name)
            .ok_or(TraceError::Missing { line, field: name })
    };
    let type_err = |name: String, expected: &'static str, v: &Value| TraceError::Type {
        line,
        field: name,
        expected,
        got: shorten(v),
    };
    let uint = |name: &'static str| -> Result<u64, TraceError> {
        let v = field(name)?;
        v.as_u64()
            .ok_or_else(|| type_err(name.to_string(), "a non-negative integer", v))
    };
    let uint32 = |name: &'static str| -> Result<u32, TraceError> {
        let v = field(name)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| type_err(name.to_string(), "an integer in 0..2^32", v))
    };
    let seq = uint("seq")?;
    let pos = uint("pos")?;
    let n_experts = uint32("n_experts")?;
    let top_k = uint32("top_k")?;
    let layers_v = field("layers")?;
    let rows = layers_v
        .as_array()
        .ok_or_else(|| type_err("layers".to_string(), "a list of lists", layers_v))?;
    let mut layers = Vec::with_capacity(rows.len());
    for (l, row_v) in rows.iter().enumerate() {
        let row = row_v
            .as_array()
            .ok_or_else(|| type_err(format!("layers[{l}]"), "a list of expert ids", row_v))?;
        let mut ids = Vec::with_capacity(row.len());
        for (i, id_v) in row.iter().enumerate() {
            let id = id_v.as_u64().ok_or_else(|| {
                type_err(format!("layers[{l}][{i}]"), "a non-negative integer", id_v)
            })?;
            if id >= n_experts as u64 {
                return Err(TraceError::ExpertOutOfRange {
                    line,
                    layer: l,
                    index: i,
                    expert: id,
                    n_experts,
                });
            }
            ids.push(id as u32);
        }
        layers.push(ids);
    }
    Ok(TraceRecord {
        seq,
        pos,
        n_experts,
        top_k,
        layers,
    })
}

/// Writes trace records as JSONL, checking each as the reader would (so what it writes reads back).
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    writer: W,
    header: Option<Trace>,
    written: usize,
}

impl<W: Write> TraceWriter<W> {
    /// A writer over `writer` (wrap a file in a `BufWriter`).
    pub fn new(writer: W) -> Self {
        TraceWriter {
            writer,
            header: None,
            written: 0,
        }
    }

    /// Writes one record as one line. Errors: the content errors of [`TraceError`] (the record is
    /// then not written), and `Io`.
    pub fn write(&mut self, record: &TraceRecord) -> Result<(), TraceError> {
        let line = self.written + 1;
        // Checked against a header-only trace, so that memory stays constant however long the trace.
        push_checked(&mut self.header, record, line)?;
        if let Some(h) = &mut self.header {
            h.seq.clear();
            h.pos.clear();
            h.ids.clear();
        }
        let io = |source| TraceError::Io { line, source };
        serde_json::to_writer(&mut self.writer, record).map_err(|e| io(e.into()))?;
        self.writer.write_all(b"\n").map_err(io)?;
        self.written += 1;
        Ok(())
    }

    /// Flushes the underlying writer. Errors: `Io`.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        self.writer.flush().map_err(|source| TraceError::Io {
            line: self.written,
            source,
        })
    }

    /// Records written so far.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Gives back the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Trace, TraceError> {
        Trace::from_reader(text.as_bytes())
    }

    #[test]
    fn reads_and_writes_back() {
        let text = concat!(
            r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 1], [3, 2]], "x": 1}"#,
            "\n\n",
            r#"{"layers": [[2, 1], [0, 3]], "top_k": 2, "n_experts": 4, "pos": 1, "seq": 0}"#,
            "\n"
        );
        let t = read(text).unwrap();
        assert_eq!(
            (t.tokens(), t.n_layers(), t.top_k(), t.n_experts()),
            (2, 2, 2, 4)
        );
        assert_eq!(t.experts(1, 0), Some(&[2, 1][..]));
        assert_eq!(t.experts(2, 0), None);
        assert_eq!(t.routed_slots(), 8);
        let layer1: Vec<&[u32]> = t.layer_steps(1).unwrap().collect();
        assert_eq!(layer1, vec![&[3, 2][..], &[0, 3][..]]);
        assert!(t.layer_steps(2).is_none());
        let mut out = Vec::new();
        t.write_to(&mut out).unwrap();
        let written = String::from_utf8(out).unwrap();
        assert_eq!(
            written.lines().next(),
            Some(r#"{"seq":0,"pos":0,"n_experts":4,"top_k":2,"layers":[[0,1],[3,2]]}"#)
        );
        assert_eq!(read(&written).unwrap(), t);
    }

    fn err(text: &str) -> String {
        read(text).unwrap_err().to_string()
    }

    #[test]
    fn malformed_lines_name_line_and_field() {
        let ok = r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 1]]}"#;
        let cases = [
            ("{\"seq\": 0,", "trace line 2: invalid JSON"),
            ("[1, 2]", "trace line 2: not a JSON object"),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "layers": [[0, 1]]}"#,
                "trace line 2: missing field `top_k`",
            ),
            (
                r#"{"seq": -1, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 1]]}"#,
                "trace line 2: field `seq`: expected a non-negative integer, got -1",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, "a"]]}"#,
                "trace line 2: field `layers[0][1]`: expected a non-negative integer, got \"a\"",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 4]]}"#,
                "trace line 2: layers[0][1] = 4 is not below n_experts = 4",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 1, 2]]}"#,
                "trace line 2: layers[0] has 3 expert ids, expected top_k = 2",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[0, 1], [2, 3]]}"#,
                "trace line 2: field `layers` is 2, but the first record has 1",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 5, "top_k": 2, "layers": [[0, 1]]}"#,
                "trace line 2: field `n_experts` is 5, but the first record has 4",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": [[1, 1]]}"#,
                "trace line 2: layers[0] lists expert 1 twice",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 5, "layers": [[1, 1]]}"#,
                "trace line 2: top_k = 5 must be in 1..=n_experts",
            ),
            (
                r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 2, "layers": []}"#,
                "trace line 2: field `layers` is empty",
            ),
        ];
        for (bad, want) in cases {
            let got = err(&format!("{ok}\n{bad}\n"));
            assert!(got.starts_with(want), "{bad}: got `{got}`, want `{want}…`");
        }
        assert_eq!(err(""), "the trace has no records");
        assert_eq!(err("\n  \n"), "the trace has no records");
    }

    #[test]
    fn writer_refuses_what_the_reader_would_refuse() {
        let mut w = TraceWriter::new(Vec::new());
        let mut r = TraceRecord {
            seq: 0,
            pos: 0,
            n_experts: 4,
            top_k: 2,
            layers: vec![vec![0, 1]],
        };
        w.write(&r).unwrap();
        r.layers = vec![vec![0, 9]];
        assert!(matches!(
            w.write(&r),
            Err(TraceError::ExpertOutOfRange { line: 2, .. })
        ));
        r.layers = vec![vec![0, 1], vec![2, 3]];
        assert!(matches!(
            w.write(&r),
            Err(TraceError::Header {
                field: "layers",
                ..
            })
        ));
        assert_eq!(w.written(), 1);
        assert_eq!(w.into_inner().iter().filter(|&&b| b == b'\n').count(), 1);
    }
}
