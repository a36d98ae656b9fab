//! Constrained decoding: what the assistant may write (JSON content, tool calls) compiled into a
//! per-step mask over the tokenizer's vocabulary, with llguidance (a lexer-driven Earley parser
//! over a token trie, guidance-ai/llguidance 1.9).
//!
//! Algorithm:
//! 1. [`GrammarCompiler::new`] builds a `toktrie` over the tekken vocabulary once: an ordinary
//!    token is its raw bytes, a control token is `0xFF` + its text (llguidance's special-token
//!    marker), so text can never spell `[TOOL_CALLS]`; EOS is the GGUF's `eos_token_id`.
//! 2. [`GrammarCompiler::compile`] writes one lark grammar for a [`GrammarSpec`] (control tokens
//!    by id, `<[9]>`; JSON through llguidance's `%json {schema}`) and builds a matcher for it:
//!
//!    ```text
//!    start: think? body            think: [THINK] TEXT? [/THINK]       (reasoning only)
//!    body (no tools):       content
//!    body (Auto):           TEXT? calls?  (Text)   |   content | calls   (JSON)
//!    body (Required):       calls         body (Function(f)): [TOOL_CALLS] "f" [ARGS] args_f
//!    calls: call (call+ with parallel)    call: [TOOL_CALLS] ("f" [ARGS] args_f | "g" [ARGS] args_g …)
//!    ```
//!
//!    `content` is `TEXT?` (any text), `%json` of `{"type": "object"}` (JsonObject) or of the
//!    schema (JsonSchema); `args_f` is `%json` of the function's `parameters`, made an object
//!    schema ([`object_schema`]): always when `strict` (a schema that fails is the client's
//!    error), and without `strict` whenever it compiles, else of `{"type": "object"}`; omitted
//!    `parameters` are an empty list (`{}`) when `strict`, any object otherwise. With JSON
//!    content, `auto` is content or calls, never both in one message.
//!
//!    A schema must have a finite instance ([`finite_instance`]: a least fixpoint over its
//!    `$ref`s, so a required property, an item or a reference that refers back to itself with no
//!    way out is refused), and the grammar's first mask must compute: both are checked when
//!    the request is compiled, so such a schema is the client's error before anything is
//!    generated.
//! 3. [`Constraint`] wraps the matcher: `compute_mask` (the costly part, safe to run on another
//!    thread while the model steps), `apply` (disallowed logits → −∞), `commit` (advance by the
//!    sampled id). EOS is allowed exactly when the grammar accepts; once nothing but the end can
//!    follow, EOS is the only allowed id.
//!
//! JSON semantics: JSON Schema as llguidance implements it (a keyword it does not implement is a
//! compile error, never ignored; `$ref` only inside the document; properties are written in
//! schema order). A strict schema (`response_format` json_schema, a `strict` function) follows
//! OpenAI's strict mode: every object schema without `additionalProperties` gets
//! `"additionalProperties": false` (llguidance's own default is JSON Schema's `true`);
//! `required` is left as written (OpenAI requires every property to be listed; a property not
//! listed stays optional here). Output is compact with Python `json.dumps` separators (`", "`,
//! `": "`), the form Mistral's tool-call arguments are trained on: no other whitespace, so a
//! sampler can never wander into unbounded whitespace.

use super::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};

/// Builds [`Constraint`]s for one tokenizer.
///
/// Built once per tokenizer (server boot: a trie over the vocabulary and llguidance's token
/// slices; docs/BENCHMARKS.md has the time); cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    ids: ControlIds,
    n_vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("n_vocab", &self.n_vocab)
            .field("ids", &self.ids)
            .finish()
    }
}

/// The control ids the grammars use; `None` where the vocabulary lacks the token.
#[derive(Clone, Copy, Debug)]
struct ControlIds {
    think: Option<u32>,
    end_think: Option<u32>,
    tool_calls: Option<u32>,
    args: Option<u32>,
}

/// What the assistant's output must look like (one request).
#[derive(Clone, Debug, PartialEq)]
pub struct GrammarSpec {
    /// The model may first write `[THINK]…[/THINK]` (reasoning_effort high): allow that prefix
    /// (any text inside).
    pub reasoning: bool,
    /// What the assistant's text (content) must be.
    pub content: ContentFormat,
    /// Function tools and how they may be called; `None` = no tools.
    pub tools: Option<ToolsSpec>,
}

/// The form of the assistant's content (OpenAI `response_format`).
#[derive(Clone, Debug, PartialEq)]
pub enum ContentFormat {
    /// Any text (`{"type": "text"}`).
    Text,
    /// One JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema, strict semantics (`{"type": "json_schema", …}`).
    JsonSchema(Value),
}

/// The tools a request offers (OpenAI `tools`, `tool_choice`, `parallel_tool_calls`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolsSpec {
    /// The function tools, in request order (errors name them `tools[i]` by this index). Empty
    /// with `Auto`: content alone; empty with `Required` or `Function`: an error.
    pub tools: Vec<ToolSpec>,
    /// Whether and which tool must be called.
    pub choice: ToolChoice,
    /// Several calls may follow one another (`Auto` and `Required`).
    pub parallel: bool,
}

/// One function tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// `function.name`.
    pub name: String,
    /// `function.parameters` (a JSON schema of the arguments object).
    pub parameters: Option<Value>,
    /// `function.strict`: the arguments must be valid against `parameters` (a schema that cannot
    /// be enforced is an error); otherwise they are held to it where it can be enforced, else
    /// any JSON object.
    pub strict: bool,
}

/// OpenAI `tool_choice` (`none` is "no tools": [`GrammarSpec::tools`] = `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Content, then optionally calls.
    Auto,
    /// At least one call and no content before it.
    Required,
    /// Exactly one call of the named function.
    Function(String),
}

/// Where in the request a schema came from (for the client-facing error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaSite {
    /// `response_format`.
    ResponseFormat,
    /// `tools[i]`.
    Tool(usize),
}

impl std::fmt::Display for SchemaSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaSite::ResponseFormat => f.write_str("response_format"),
            SchemaSite::Tool(i) => write!(f, "tools[{i}]"),
        }
    }
}

/// Errors of grammar compilation and constrained decoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// A schema the grammar engine cannot compile (unsupported keyword, bad `$ref`, unsatisfiable).
    #[error("{site}: the JSON schema is not supported for constrained decoding: {message}")]
    Schema {
        /// Which part of the request.
        site: SchemaSite,
        /// llguidance's reason.
        message: String,
    },
    /// A tool whose name cannot be matched (empty or a duplicate).
    #[error("{site}: {message}")]
    Tool {
        /// Which tool.
        site: SchemaSite,
        /// What is wrong.
        message: String,
    },
    /// `tool_choice` names a function that is not among `tools`.
    #[error("tool_choice: the function {0:?} is not among tools")]
    UnknownToolChoice(String),
    /// `tool_choice` requires a call but `tools` is empty.
    #[error("tool_choice: a tool call is required but tools is empty")]
    NoTools,
    /// The tokenizer lacks a control token the grammar needs.
    #[error("the model's tokenizer has no {0} control token, needed for this request")]
    MissingControlToken(&'static str),
    /// The sampled token is not allowed in the current state.
    #[error("token {id} is not allowed by the grammar here: {message}")]
    TokenRejected {
        /// The token id.
        id: u32,
        /// The matcher's reason.
        message: String,
    },
    /// The logits row is shorter than the grammar's vocabulary.
    #[error("the logits have {got} entries but the grammar's vocabulary has {want}")]
    VocabMismatch {
        /// Logits length.
        got: usize,
        /// Tokenizer `n_vocab`.
        want: usize,
    },
    /// The matcher failed (an internal error, not the client's).
    #[error("the grammar matcher failed: {0}")]
    Matcher(String),
}

impl GrammarError {
    /// The request parameter a client error names (`response_format`, `tools[i]`,
    /// `tool_choice`), or `None` for errors that are not the client's.
    pub fn param(&self) -> Option<String> {
        match self {
            GrammarError::Schema {
                site: SchemaSite::Tool(i),
                ..
            } => Some(format!("tools[{i}].function.parameters")),
            GrammarError::Schema { site, .. } | GrammarError::Tool { site, .. } => {
                Some(site.to_string())
            }
            GrammarError::UnknownToolChoice(_) | GrammarError::NoTools => {
                Some("tool_choice".to_owned())
            }
            GrammarError::MissingControlToken(_)
            | GrammarError::TokenRejected { .. }
            | GrammarError::VocabMismatch { .. }
            | GrammarError::Matcher(_) => None,
        }
    }
}

/// One request's matcher state; `Send`, so the mask can be computed on another thread.
pub struct Constraint {
    matcher: Matcher,
    mask: Option<SimpleVob>,
    n_vocab: usize,
    eos: u32,
    /// EOS was committed: from now on EOS alone is allowed.
    ended: bool,
    mask_times: Vec<Duration>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("n_vocab", &self.n_vocab)
            .field("mask_ready", &self.mask.is_some())
            .field("masks_computed", &self.mask_times.len())
            .finish()
    }
}

/// Bytes of stack for a thread that runs llguidance ([`GrammarCompiler::compile`], and the
/// callers' mask and decode threads): it recurses once per level of a schema's `$ref` chains,
/// a few KiB each, and a request may nest thousands; address space, touched only as deep as a
/// grammar goes.
pub const GRAMMAR_STACK: usize = 256 << 20;

/// JSON output options given to llguidance (`x-guidance`) in every `%json` schema.
fn json_options() -> Value {
    json!({
        "item_separator": ", ",
        "key_separator": ": ",
        "whitespace_flexible": false,
    })
}

impl GrammarCompiler {
    /// Builds the token trie of `tokenizer`'s vocabulary (ids `0..n_vocab`, EOS =
    /// `eos_id()`) and llguidance's parser factory over it.
    ///
    /// Errors: [`GrammarError::Matcher`] if llguidance rejects the vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> Result<GrammarCompiler, GrammarError> {
        let n_vocab = tokenizer.n_vocab();
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: Some(tokenizer.bos_id()),
            ..TokRxInfo::new(n_vocab as u32, tokenizer.eos_id())
        };
        let trie = TokTrie::from(&info, &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Matcher(e.to_string()))?;
        factory.quiet();
        // Errors name the rule that failed, not the parser's state (they reach clients).
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            ids: ControlIds {
                think: tokenizer.special_id("[THINK]"),
                end_think: tokenizer.special_id("[/THINK]"),
                tool_calls: tokenizer.special_id("[TOOL_CALLS]"),
                args: tokenizer.special_id("[ARGS]"),
            },
            n_vocab,
            eos: tokenizer.eos_id(),
        })
    }

    /// Compiles `spec` (see the module note for the grammar) into a fresh [`Constraint`].
    ///
    /// Errors: [`GrammarError::Schema`] naming `response_format` or `tools[i]` for a schema
    /// llguidance cannot compile; [`GrammarError::Tool`] for an empty or duplicate tool name;
    /// [`GrammarError::UnknownToolChoice`], [`GrammarError::NoTools`];
    /// [`GrammarError::MissingControlToken`] when the vocabulary lacks `[THINK]`, `[/THINK]`,
    /// `[TOOL_CALLS]` or `[ARGS]` and the spec needs it.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("aubier-grammar".to_owned())
                .stack_size(GRAMMAR_STACK)
                .spawn_scoped(s, || self.compile_here(spec))
                .map_err(|e| GrammarError::Matcher(format!("starting the compiler thread: {e}")))?
                .join()
                .unwrap_or_else(|_| {
                    Err(GrammarError::Matcher(
                        "the grammar compiler panicked".to_owned(),
                    ))
                })
        })
    }

    /// [`GrammarCompiler::compile`] on the calling thread.
    fn compile_here(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let lark = self.lark(spec)?;
        let matcher = self
            .matcher(&lark)
            .map_err(|message| self.locate(spec, message))?;
        let mut c = Constraint {
            matcher,
            mask: None,
            n_vocab: self.n_vocab,
            eos: self.eos,
            ended: false,
            mask_times: Vec::new(),
        };
        match c.compute_mask() {
            Err(GrammarError::Matcher(message)) => Err(self.locate(spec, message)),
            Err(e) => Err(e),
            Ok(()) => Ok(c),
        }
    }

    /// llguidance's message when the grammar of the one JSON schema `schema` (with its options)
    /// does not compile or its first mask fails; `None` when it works.
    fn schema_fails(&self, schema: &str) -> Option<String> {
        let lark = format!("start: %json {schema}\n");
        match self.matcher(&lark) {
            Err(message) => Some(message),
            Ok(mut m) => m.compute_mask_or_eos().err().map(|e| e.to_string()),
        }
    }

    /// Builds a matcher for a lark grammar; llguidance's message on failure (a panic inside it
    /// is caught and reported the same way).
    fn matcher(&self, lark: &str) -> Result<Matcher, String> {
        let grammar = TopLevelGrammar::from_lark(lark.to_owned());
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create_parser(grammar)
        }));
        match built {
            Ok(Ok(parser)) => {
                let matcher = Matcher::new(Ok(parser));
                match matcher.get_error() {
                    Some(e) => Err(e),
                    None => Ok(matcher),
                }
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the grammar engine panicked on this grammar".to_owned()),
        }
    }

    /// Finds which schema of `spec` made the whole grammar fail by compiling each alone; a
    /// failure no single schema explains is the engine's own ([`GrammarError::Matcher`]).
    fn locate(&self, spec: &GrammarSpec, whole: String) -> GrammarError {
        let mut schemas = Vec::new();
        if let ContentFormat::JsonSchema(s) = &spec.content {
            schemas.push((SchemaSite::ResponseFormat, s));
        }
        let objects: Vec<(usize, Value)> = spec
            .tools
            .iter()
            .flat_map(|tools| {
                tools.tools.iter().enumerate().filter_map(|(i, t)| {
                    let p = t.parameters.as_ref().filter(|_| t.strict)?;
                    Some((i, object_schema(p).ok()?))
                })
            })
            .collect();
        schemas.extend(objects.iter().map(|(i, p)| (SchemaSite::Tool(*i), p)));
        for (site, schema) in schemas {
            if let Some(message) = self.schema_fails(&strict_schema(schema)) {
                return GrammarError::Schema { site, message };
            }
        }
        GrammarError::Matcher(whole)
    }

    fn id(&self, id: Option<u32>, name: &'static str) -> Result<String, GrammarError> {
        id.map(|i| format!("<[{i}]>"))
            .ok_or(GrammarError::MissingControlToken(name))
    }

    /// The lark text for `spec`.
    fn lark(&self, spec: &GrammarSpec) -> Result<String, GrammarError> {
        let mut g = String::new();
        if spec.reasoning {
            let think = self.id(self.ids.think, "[THINK]")?;
            let end = self.id(self.ids.end_think, "[/THINK]")?;
            g.push_str("start: think? body\n");
            let _ = writeln!(g, "think: {think} TEXT? {end}");
        } else {
            g.push_str("start: body\n");
        }
        g.push_str("TEXT: /(?s:.+)/\n");
        let content = match &spec.content {
            ContentFormat::Text => "TEXT?".to_owned(),
            ContentFormat::JsonObject => format!("%json {}", with_options(any_object())),
            ContentFormat::JsonSchema(s) => {
                finite(s, SchemaSite::ResponseFormat)?;
                format!("%json {}", strict_schema(s))
            }
        };
        let is_text = spec.content == ContentFormat::Text;
        let _ = writeln!(g, "content: {content}");
        let Some(tools) = &spec.tools else {
            g.push_str("body: content\n");
            return Ok(g);
        };
        let calls_id = self.id(self.ids.tool_calls, "[TOOL_CALLS]")?;
        let args_id = self.id(self.ids.args, "[ARGS]")?;
        for (i, t) in tools.tools.iter().enumerate() {
            let site = SchemaSite::Tool(i);
            if t.name.is_empty() {
                return Err(GrammarError::Tool {
                    site,
                    message: "the function name is empty".to_owned(),
                });
            }
            if tools.tools[..i].iter().any(|u| u.name == t.name) {
                return Err(GrammarError::Tool {
                    site,
                    message: format!("the function name {:?} is given twice", t.name),
                });
            }
            let args = match (&t.parameters, t.strict) {
                (Some(p), true) => {
                    let object = object_schema(p)
                        .map_err(|message| GrammarError::Schema { site, message })?;
                    finite(&object, SchemaSite::Tool(i))?;
                    strict_schema(&object)
                }
                (Some(p), false) => object_schema(p)
                    .ok()
                    .filter(finite_instance)
                    .map(|object| strict_schema(&object))
                    .filter(|args| self.schema_fails(args).is_none())
                    .unwrap_or_else(|| with_options(any_object())),
                // OpenAI: omitted parameters are an empty parameter list.
                (None, true) => strict_schema(&json!({"type": "object", "properties": {}})),
                (None, false) => with_options(any_object()),
            };
            let name = serde_json::to_string(&t.name).unwrap_or_default();
            let _ = writeln!(g, "fn_{i}: {name} {args_id} args_{i}");
            let _ = writeln!(g, "args_{i}: %json {args}");
        }
        let alts: Vec<String> = (0..tools.tools.len()).map(|i| format!("fn_{i}")).collect();
        match &tools.choice {
            ToolChoice::Function(f) => {
                let i = tools
                    .tools
                    .iter()
                    .position(|t| &t.name == f)
                    .ok_or_else(|| GrammarError::UnknownToolChoice(f.clone()))?;
                let _ = writeln!(g, "body: {calls_id} fn_{i}");
                return Ok(g);
            }
            ToolChoice::Required if tools.tools.is_empty() => return Err(GrammarError::NoTools),
            ToolChoice::Auto if tools.tools.is_empty() => {
                g.push_str("body: content\n");
                return Ok(g);
            }
            ToolChoice::Required | ToolChoice::Auto => {}
        }
        let _ = writeln!(g, "call: {calls_id} ({})", alts.join(" | "));
        g.push_str(if tools.parallel {
            "calls: call+\n"
        } else {
            "calls: call\n"
        });
        g.push_str(match (&tools.choice, is_text) {
            (ToolChoice::Auto, true) => "body: content calls?\n",
            (ToolChoice::Auto, false) => "body: content | calls\n",
            _ => "body: calls\n",
        });
        Ok(g)
    }
}

/// The schema of any JSON object (`json_object`, tool arguments without a schema to hold).
fn any_object() -> Value {
    json!({"type": "object"})
}

/// A tool's `parameters` as the schema of an object (OpenAI's contract: arguments are a JSON
/// object): `"type": "object"` added where no type is given (beside an `anyOf`, it keeps the
/// object branches), `["object", …]` narrowed to it, `true` made `{"type": "object"}`.
///
/// Errors: why `parameters` cannot describe an object (another type, `false`, not a schema).
fn object_schema(parameters: &Value) -> Result<Value, String> {
    let mut m = match parameters {
        Value::Object(m) => m.clone(),
        Value::Bool(true) => serde_json::Map::new(),
        other => {
            return Err(format!(
                "parameters must be the schema of an object, not {other}"
            ))
        }
    };
    match m.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(Value::Array(ts)) if ts.iter().any(|t| t == "object") => {}
        Some(t) => {
            return Err(format!(
                "parameters must be the schema of an object (the arguments are a JSON object), \
                 not of type {t}"
            ))
        }
    }
    m.insert("type".to_owned(), json!("object"));
    Ok(Value::Object(m))
}

/// `Err` naming `site` when `schema` has no finite instance ([`finite_instance`]).
fn finite(schema: &Value, site: SchemaSite) -> Result<(), GrammarError> {
    if finite_instance(schema) {
        Ok(())
    } else {
        Err(GrammarError::Schema {
            site,
            message: "no finite JSON value satisfies it: a required property, an item or a \
                      $ref refers back to itself with no way out"
                .to_owned(),
        })
    }
}

/// Rounds of [`finite_instance`]'s fixpoint before it gives a reference the benefit of the doubt.
const FIXPOINT_ROUNDS: usize = 64;

/// Whether some finite JSON value satisfies `schema`, as far as recursion decides it: the least
/// fixpoint of "has a finite instance" over the schema's local `$ref` targets (each assumed
/// not to until shown to), where an object needs its `required` properties, an array its
/// `minItems` first items, `allOf` every branch, `anyOf` / `oneOf` one, and any other type, a
/// `const` or an `enum` needs nothing. Keywords that bound values otherwise (lengths, ranges,
/// patterns) are left to the grammar engine; a `$ref` it cannot resolve here counts as
/// satisfiable, and so does every one still open after [`FIXPOINT_ROUNDS`] rounds.
fn finite_instance(schema: &Value) -> bool {
    let mut refs = BTreeSet::new();
    let mut named = HashMap::new();
    collect_refs(schema, &mut refs, &mut named);
    let mut known: HashMap<String, bool> = refs.iter().map(|r| (r.clone(), false)).collect();
    for _ in 0..FIXPOINT_ROUNDS {
        let mut changed = false;
        for r in &refs {
            let target = named
                .get(r.as_str())
                .copied()
                .or_else(|| local_target(schema, r));
            if !known[r] && target.is_none_or(|t| has_instance(t, &known)) {
                known.insert(r.clone(), true);
                changed = true;
            }
        }
        if !changed {
            // Every reference must have an instance: the grammar engine expands a reference it
            // could skip (an optional property), and one that loops never ends.
            return known.values().all(|&k| k) && has_instance(schema, &known);
        }
    }
    true
}

/// Every `$ref` string inside `v`, and the subschemas named by `$id` and `$anchor` (as
/// `#anchor`), which references may name instead of a pointer.
fn collect_refs<'a>(
    v: &'a Value,
    out: &mut BTreeSet<String>,
    named: &mut HashMap<String, &'a Value>,
) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.insert(r.clone());
            }
            if let Some(Value::String(id)) = m.get("$id") {
                named.insert(id.clone(), v);
            }
            if let Some(Value::String(a)) = m.get("$anchor") {
                named.insert(format!("#{a}"), v);
            }
            m.values().for_each(|x| collect_refs(x, out, named));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out, named)),
        _ => {}
    }
}

/// The subschema a local `$ref` (`#` and a JSON pointer) names in `root`.
fn local_target<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    root.pointer(r.strip_prefix('#')?)
}

/// One round of [`finite_instance`] on `schema`, `known` telling which references have one.
fn has_instance(schema: &Value, known: &HashMap<String, bool>) -> bool {
    let m = match schema {
        Value::Bool(b) => return *b,
        Value::Object(m) => m,
        _ => return true,
    };
    let all = |key: &str| {
        m.get(key)
            .and_then(Value::as_array)
            .is_none_or(|xs| xs.iter().all(|x| has_instance(x, known)))
    };
    let any = |key: &str| {
        m.get(key)
            .and_then(Value::as_array)
            .is_none_or(|xs| xs.iter().any(|x| has_instance(x, known)))
    };
    let reference = match m.get("$ref") {
        Some(Value::String(r)) => known.get(r).copied().unwrap_or(true),
        _ => true,
    };
    if !(reference && all("allOf") && any("anyOf") && any("oneOf")) {
        return false;
    }
    if m.contains_key("const") || m.contains_key("enum") {
        return true;
    }
    let types: Vec<&str> = match m.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return true,
    };
    types.iter().any(|&t| match t {
        "object" => {
            let required = m
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            let mut needed = 0;
            let named = required.clone().all(|name| {
                needed += 1;
                let property = m.get("properties").and_then(|p| p.get(name));
                let schema = property.or_else(|| m.get("additionalProperties"));
                let patterns = m.get("patternProperties").and_then(Value::as_object);
                schema.is_none_or(|s| has_instance(s, known))
                    && patterns.is_none_or(|p| p.values().all(|s| has_instance(s, known)))
            });
            // Properties past the required ones (`minProperties`) need one schema that has an
            // instance: a listed property, a pattern's or the additional ones'.
            let min = m.get("minProperties").and_then(Value::as_u64).unwrap_or(0);
            let more = min <= needed
                || m.get("properties")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flat_map(|p| p.values())
                    .chain(
                        m.get("patternProperties")
                            .and_then(Value::as_object)
                            .into_iter()
                            .flat_map(|p| p.values()),
                    )
                    .chain(m.get("additionalProperties"))
                    .any(|s| has_instance(s, known))
                || !m.contains_key("additionalProperties");
            named && more
        }
        "array" => {
            // The first `minItems` items: those of `prefixItems`, then `items` for the rest
            // (checked once, however large `minItems` is).
            let min = m.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let prefix = m
                .get("prefixItems")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            let fixed = prefix
                .iter()
                .take(usize::try_from(min).unwrap_or(usize::MAX));
            fixed.into_iter().all(|s| has_instance(s, known))
                && (min <= prefix.len() as u64
                    || m.get("items").is_none_or(|s| has_instance(s, known)))
        }
        _ => true,
    })
}

/// `schema` with llguidance's output options set at its top (replacing any the client sent).
fn with_options(mut schema: Value) -> String {
    if let Value::Object(m) = &mut schema {
        m.insert("x-guidance".to_owned(), json_options());
    } else {
        schema = json!({"allOf": [schema], "x-guidance": json_options()});
    }
    schema.to_string()
}

/// `schema` with OpenAI strict-mode defaults (see the module note) and the output options.
fn strict_schema(schema: &Value) -> String {
    let mut s = schema.clone();
    close_objects(&mut s);
    with_options(s)
}

/// Sets `"additionalProperties": false` on every object schema inside `schema` that does not
/// say otherwise, walking the subschema positions of JSON Schema 2020-12 (and draft-07's
/// `definitions`, `items` arrays, `additionalItems`).
fn close_objects(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    let is_object = match m.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => m.contains_key("properties"),
    };
    // A `const` or an `enum` fixes the value already: closing it could only forbid it.
    let fixed = m.contains_key("const") || m.contains_key("enum");
    if is_object && !fixed && !m.contains_key("additionalProperties") {
        m.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for key in [
        "additionalProperties",
        "items",
        "additionalItems",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "unevaluatedItems",
        "unevaluatedProperties",
        "propertyNames",
    ] {
        if let Some(sub) = m.get_mut(key) {
            match sub {
                Value::Array(list) => list.iter_mut().for_each(close_objects),
                other => close_objects(other),
            }
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(list)) = m.get_mut(key) {
            list.iter_mut().for_each(close_objects);
        }
    }
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(Value::Object(map)) = m.get_mut(key) {
            map.values_mut().for_each(close_objects);
        }
    }
    m.remove("x-guidance");
}

impl Constraint {
    /// Computes the set of allowed next tokens for the current state (the expensive part; may run
    /// on another thread while the model steps). Once the grammar is complete the set is EOS
    /// alone. A second call without a `commit` in between does nothing.
    ///
    /// Errors: [`GrammarError::Matcher`] (the matcher is in an error state or ran out of its
    /// per-step budget).
    pub fn compute_mask(&mut self) -> Result<(), GrammarError> {
        if self.mask.is_some() {
            return Ok(());
        }
        let t0 = Instant::now();
        let mask = if self.ended {
            let mut only_eos = SimpleVob::alloc(self.n_vocab);
            only_eos.allow_token(self.eos);
            only_eos
        } else {
            self.matcher
                .compute_mask_or_eos()
                .map_err(|e| GrammarError::Matcher(e.to_string()))?
        };
        self.mask_times.push(t0.elapsed());
        self.mask = Some(mask);
        Ok(())
    }

    /// Sets every disallowed logit of `logits` (`[n_vocab]` f32; entries past the tokenizer's
    /// vocabulary, a model's padding, are disallowed too) to −∞, computing the mask first if it
    /// is not yet computed.
    ///
    /// Errors: [`GrammarError::VocabMismatch`] when `logits` is shorter than the vocabulary;
    /// those of [`Constraint::compute_mask`].
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        if logits.len() < self.n_vocab {
            return Err(GrammarError::VocabMismatch {
                got: logits.len(),
                want: self.n_vocab,
            });
        }
        self.compute_mask()?;
        let Some(mask) = &self.mask else {
            return Err(GrammarError::Matcher("no mask was computed".to_owned()));
        };
        let n = mask.len().min(self.n_vocab);
        mask.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        logits[n..].fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Advances by the sampled token `id`. EOS is accepted where the grammar accepts, and
    /// ends it: after it only EOS is allowed (a caller that ignores EOS keeps getting it).
    ///
    /// Errors: [`GrammarError::TokenRejected`] when the grammar does not allow `id` here (the
    /// constraint is then in an error state).
    pub fn commit(&mut self, id: u32) -> Result<(), GrammarError> {
        self.mask = None;
        if id == self.eos && (self.ended || self.is_accepting()) {
            self.ended = true;
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::TokenRejected {
                id,
                message: e.to_string(),
            })
    }

    /// Whether the grammar accepts the tokens committed so far (EOS would be allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.ended || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Wall time of every [`Constraint::compute_mask`] that computed a mask, in order.
    pub fn mask_times(&self) -> &[Duration] {
        &self.mask_times
    }
}

#[cfg(test)]
mod tests {
    //! Grammars over the bundled model's real tekken vocabulary (8192 ids), driven through the
    //! one decode loop by a stepper of random logits; outputs are checked by an independent JSON
    //! Schema validator (the `jsonschema` crate) and serde_json.
    use super::*;
    use crate::generate::{generate, FinishReason, GenerateOutput, GenerateParams, Stepper};
    use crate::gguf::GgufFile;
    use crate::sampler::SamplingParams;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::ops::ControlFlow;
    use std::path::PathBuf;
    use std::sync::OnceLock;

    fn fixture() -> &'static (Tokenizer, GrammarCompiler) {
        static FIXTURE: OnceLock<(Tokenizer, GrammarCompiler)> = OnceLock::new();
        FIXTURE.get_or_init(|| {
            let path =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf");
            let file = GgufFile::open(&path).expect("bundled model");
            let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
            let compiler = GrammarCompiler::new(&tok).expect("compiler");
            (tok, compiler)
        })
    }

    fn tok() -> &'static Tokenizer {
        &fixture().0
    }

    fn compile(spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        fixture().1.compile(spec)
    }

    fn special(name: &str) -> u32 {
        tok().special_id(name).expect(name)
    }

    /// Random logits, uniform in [0, 8), a fresh row per position.
    struct RandomStepper {
        rng: ChaCha8Rng,
        n_vocab: usize,
    }

    impl Stepper for RandomStepper {
        fn reset(&mut self) {}
        fn kv_max(&self) -> usize {
            4096
        }
        fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
            Ok((0..tokens.len() * self.n_vocab)
                .map(|_| self.rng.random::<f32>() * 8.0)
                .collect())
        }
    }

    fn run(c: &mut Constraint, seed: u64, temperature: f32, max_tokens: usize) -> GenerateOutput {
        let mut stepper = RandomStepper {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed),
            n_vocab: tok().n_vocab(),
        };
        let params = GenerateParams {
            max_tokens,
            sampling: SamplingParams {
                temperature,
                seed,
                ..SamplingParams::default()
            },
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            eos_ids: vec![tok().eos_id()],
            keep_prompt_logits: false,
            logprobs: None,
        };
        generate(&mut stepper, &[1, 3], &params, Some(c), &mut |_| {
            ControlFlow::Continue(())
        })
        .expect("generate")
    }

    fn content(c: ContentFormat) -> GrammarSpec {
        GrammarSpec {
            reasoning: false,
            content: c,
            tools: None,
        }
    }

    fn validates(schema: &Value, instance: &Value) -> bool {
        jsonschema::validator_for(schema)
            .expect("the test schema is valid")
            .is_valid(instance)
    }

    fn allowed(c: &mut Constraint, id: u32) -> bool {
        let mut logits = vec![0.0; tok().n_vocab()];
        c.apply(&mut logits).expect("apply");
        logits[id as usize].is_finite()
    }

    fn n_allowed(c: &mut Constraint) -> usize {
        let mut logits = vec![0.0; tok().n_vocab()];
        c.apply(&mut logits).expect("apply");
        logits.iter().filter(|l| l.is_finite()).count()
    }

    /// Commits `ids` one by one, checking each is in the mask first; `Err(i)` at the first
    /// id the mask refuses.
    fn feed(c: &mut Constraint, ids: &[u32]) -> Result<(), usize> {
        for (i, &id) in ids.iter().enumerate() {
            if !allowed(c, id) {
                return Err(i);
            }
            c.commit(id).map_err(|_| i)?;
        }
        Ok(())
    }

    fn text(s: &str) -> Vec<u32> {
        tok().encode(s).expect("encode")
    }

    fn person_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                "ok": {"type": "boolean"},
                "pet": {
                    "type": "object",
                    "properties": {"kind": {"enum": ["cat", "dog"]}},
                    "required": ["kind"]
                }
            },
            "required": ["name", "age", "tags", "ok", "pet"]
        })
    }

    /// The test's own strict reading of [`person_schema`]: no other keys at either level.
    fn person_schema_closed() -> Value {
        let mut s = person_schema();
        s["additionalProperties"] = json!(false);
        s["properties"]["pet"]["additionalProperties"] = json!(false);
        s
    }

    #[test]
    fn compiler_and_constraint_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<GrammarCompiler>();
        send::<Constraint>();
    }

    #[test]
    fn json_schema_outputs_validate_for_many_seeds() {
        let spec = content(ContentFormat::JsonSchema(person_schema()));
        for seed in 0..24 {
            let mut c = compile(&spec).expect("compile");
            let out = run(&mut c, seed, 1.0, 400);
            let s = tok().decode(&out.ids);
            assert_eq!(out.finish, FinishReason::Stop, "seed {seed}: {s:?}");
            let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            assert!(validates(&person_schema_closed(), &v), "seed {seed}: {s}");
            assert!(c.mask_times().len() >= out.ids.len(), "a mask per step");
        }
    }

    #[test]
    fn single_value_enum_at_temperature_zero_is_that_value() {
        let schema = json!({
            "type": "object",
            "properties": {"city": {"enum": ["Paris, Île-de-France"]}},
            "required": ["city"]
        });
        for seed in 0..4 {
            let mut c = compile(&content(ContentFormat::JsonSchema(schema.clone()))).unwrap();
            let out = run(&mut c, seed, 0.0, 200);
            assert_eq!(out.finish, FinishReason::Stop);
            assert_eq!(
                tok().decode(&out.ids),
                r#"{"city": "Paris, Île-de-France"}"#
            );
        }
    }

    #[test]
    fn json_object_outputs_are_objects() {
        let mut stopped = 0;
        for seed in 0..16 {
            let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
            let out = run(&mut c, seed, 1.0, 600);
            let s = tok().decode(&out.ids);
            if out.finish == FinishReason::Stop {
                stopped += 1;
                let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                assert!(v.is_object(), "{s}");
            } else {
                assert!(s.starts_with('{'), "{s:?}");
            }
        }
        // Unbounded keys and values: with random logits not every object closes in time.
        assert!(
            stopped >= 6,
            "only {stopped} of 16 objects closed within 600 tokens"
        );
    }

    fn weather_tools(choice: ToolChoice, parallel: bool) -> GrammarSpec {
        GrammarSpec {
            reasoning: false,
            content: ContentFormat::Text,
            tools: Some(ToolsSpec {
                tools: vec![
                    ToolSpec {
                        name: "get_weather".to_owned(),
                        parameters: Some(json!({
                            "type": "object",
                            "properties": {
                                "city": {"type": "string", "maxLength": 10},
                                "unit": {"enum": ["celsius", "fahrenheit"]}
                            },
                            "required": ["city", "unit"]
                        })),
                        strict: true,
                    },
                    ToolSpec {
                        name: "get_time".to_owned(),
                        parameters: Some(json!({
                            "type": "object",
                            "properties": {"zone": {"enum": ["UTC", "CET"]}}
                        })),
                        strict: true,
                    },
                ],
                choice,
                parallel,
            }),
        }
    }

    /// [`weather_tools`] plus `log_event`, whose schema is not strict: its arguments are any
    /// object (unbounded, so random runs do not use it).
    fn with_loose_tool(mut spec: GrammarSpec) -> GrammarSpec {
        spec.tools.as_mut().unwrap().tools.push(ToolSpec {
            name: "log_event".to_owned(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"level": {"type": "integer"}},
                "required": ["level"]
            })),
            strict: false,
        });
        spec
    }

    /// `[TOOL_CALLS]name[ARGS]{…}` runs of `ids` as (name, arguments text); panics on ids
    /// before the first call.
    fn calls(ids: &[u32]) -> Vec<(String, String)> {
        let (calls_id, args_id) = (special("[TOOL_CALLS]"), special("[ARGS]"));
        assert_eq!(ids.first(), Some(&calls_id), "{ids:?}");
        ids.split(|&i| i == calls_id)
            .skip(1)
            .map(|call| {
                let at = call.iter().position(|&i| i == args_id).expect("[ARGS]");
                (tok().decode(&call[..at]), tok().decode(&call[at + 1..]))
            })
            .collect()
    }

    fn check_call(spec: &GrammarSpec, name: &str, args: &str) {
        let tools = &spec.tools.as_ref().unwrap().tools;
        let tool = tools.iter().find(|t| t.name == name).expect("a known name");
        let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(v.is_object(), "{args}");
        if tool.strict {
            let mut closed = tool.parameters.clone().unwrap();
            closed["additionalProperties"] = json!(false);
            assert!(validates(&closed, &v), "{name}: {args}");
        }
    }

    #[test]
    fn required_produces_valid_calls() {
        for parallel in [false, true] {
            let spec = weather_tools(ToolChoice::Required, parallel);
            let mut names = BTreeSet::new();
            for seed in 0..16 {
                let mut c = compile(&spec).unwrap();
                let out = run(&mut c, seed, 1.0, 300);
                assert_eq!(out.finish, FinishReason::Stop, "{:?}", out.ids);
                let calls = calls(&out.ids);
                if !parallel {
                    assert_eq!(calls.len(), 1);
                }
                for (name, args) in &calls {
                    check_call(&spec, name, args);
                    names.insert(name.clone());
                }
            }
            assert_eq!(
                names.len(),
                2,
                "both tools were chosen at random: {names:?}"
            );
        }
    }

    #[test]
    fn named_function_produces_exactly_that_call() {
        let spec = weather_tools(ToolChoice::Function("get_weather".to_owned()), true);
        for seed in 0..12 {
            let mut c = compile(&spec).unwrap();
            let out = run(&mut c, seed, 1.0, 300);
            assert_eq!(out.finish, FinishReason::Stop);
            let calls = calls(&out.ids);
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].0, "get_weather");
            check_call(&spec, &calls[0].0, &calls[0].1);
        }
    }

    fn call_ids(name: &str, args: &str) -> Vec<u32> {
        let mut ids = vec![special("[TOOL_CALLS]")];
        ids.extend(text(name));
        ids.push(special("[ARGS]"));
        ids.extend(text(args));
        ids
    }

    #[test]
    fn auto_allows_text_then_calls_and_parallel_allows_several() {
        let first = call_ids("get_weather", r#"{"city": "Oslo", "unit": "celsius"}"#);
        let second = call_ids("log_event", r#"{"level": 3}"#);
        let mut both = text("Let me check.");
        both.extend(&first);
        both.extend(&second);

        let mut c = compile(&with_loose_tool(weather_tools(ToolChoice::Auto, true))).unwrap();
        assert!(c.is_accepting(), "Auto with text content may end at once");
        assert_eq!(feed(&mut c, &both), Ok(()));
        assert!(c.is_accepting());
        assert!(allowed(&mut c, tok().eos_id()));

        let spec = with_loose_tool(weather_tools(ToolChoice::Auto, false));
        let mut c = compile(&spec).unwrap();
        let second_at = both.len() - second.len();
        assert_eq!(feed(&mut c, &both), Err(second_at), "one call only");
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &both[..second_at]), Ok(()));
        assert_eq!(n_allowed(&mut c), 1, "after the one call only EOS");
        assert!(allowed(&mut c, tok().eos_id()));
    }

    #[test]
    fn calls_are_refused_where_the_grammar_says_no() {
        // Required: no content first.
        let mut c = compile(&weather_tools(ToolChoice::Required, true)).unwrap();
        assert!(!c.is_accepting());
        assert!(!allowed(&mut c, tok().eos_id()));
        assert_eq!(feed(&mut c, &text("Hi")), Err(0));
        // An unknown name, and a strict tool's arguments against its schema.
        let mut c = compile(&weather_tools(ToolChoice::Required, true)).unwrap();
        assert_eq!(
            feed(&mut c, &call_ids("get_wind", "{}")).map_err(|i| i > 1),
            Err(true)
        );
        let bad = call_ids("get_weather", r#"{"city": "Oslo", "unit": "kelvin"}"#);
        let mut c = compile(&weather_tools(ToolChoice::Required, true)).unwrap();
        assert!(feed(&mut c, &bad).is_err());
        // Named function: the other name is refused.
        let spec = weather_tools(ToolChoice::Function("get_time".to_owned()), true);
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("get_weather", "{}")).is_err());
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("get_time", r#"{"any": [1]}"#)).is_err());
        let mut c = compile(&spec).unwrap();
        assert_eq!(
            feed(&mut c, &call_ids("get_time", r#"{"zone": "CET"}"#)),
            Ok(())
        );
        assert_eq!(n_allowed(&mut c), 1);
        // Not strict: held to the schema all the same where it compiles (its required integer, no
        // other key).
        let spec = with_loose_tool(weather_tools(ToolChoice::Required, false));
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("log_event", r#"{"any": [1]}"#)).is_err());
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("log_event", r#"{"level": "high"}"#)).is_err());
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("log_event", "{}")).is_err());
        let mut c = compile(&spec).unwrap();
        assert_eq!(
            feed(&mut c, &call_ids("log_event", r#"{"level": 2}"#)),
            Ok(())
        );
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("log_event", "[1]")).is_err());
        // Text can never spell a control token: the mask holds the control id, not "[ARGS]" text.
        let mut c = compile(&spec).unwrap();
        let mut ids = vec![special("[TOOL_CALLS]")];
        ids.extend(text("get_time[ARGS]{}"));
        assert!(feed(&mut c, &ids).is_err());
    }

    /// The spec of one tool `f` with `parameters`, `strict`, that must be called.
    fn one_tool(parameters: Value, strict: bool) -> GrammarSpec {
        GrammarSpec {
            reasoning: false,
            content: ContentFormat::Text,
            tools: Some(ToolsSpec {
                tools: vec![ToolSpec {
                    name: "f".to_owned(),
                    parameters: Some(parameters),
                    strict,
                }],
                choice: ToolChoice::Required,
                parallel: false,
            }),
        }
    }

    #[test]
    fn a_huge_min_items_is_checked_once_per_item_schema() {
        // 2^62 items: checking each position would never end; `items` is checked once.
        let huge = json!({"type": "array", "items": {"type": "integer"}, "minItems": 1u64 << 62});
        assert!(compile(&content(ContentFormat::JsonSchema(huge))).is_ok());
        let prefix = json!({"type": "array", "prefixItems": [{"type": "integer"}],
                            "items": false, "minItems": 1});
        assert!(compile(&content(ContentFormat::JsonSchema(prefix))).is_ok());
    }

    #[test]
    fn schemas_without_a_finite_instance_are_the_clients_error_before_generation() {
        let unsatisfiable = [
            json!({"$ref": "#"}),
            json!({"anyOf": [{"$ref": "#"}]}),
            json!({"allOf": [{"$ref": "#"}]}),
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                   "$ref": "#/$defs/a"}),
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"$ref": "#"},
                   "minItems": 1}}, "required": ["a"]}),
            json!({"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#"}],
                   "minItems": 2}),
            json!({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"$ref": "#"},
                   "minItems": 2}),
            // A reference loop under an optional property: the engine would still expand it.
            json!({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}),
            // References by anchor and by id.
            json!({"$anchor": "me", "type": "object", "properties": {"a": {"$ref": "#me"}},
                   "required": ["a"]}),
            json!({"$id": "http://x/s", "type": "object", "properties": {"a": {"$ref": "http://x/s"}},
                   "required": ["a"]}),
            // More properties than listed, each of them the schema itself.
            json!({"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1}),
        ];
        for schema in &unsatisfiable {
            let e = compile(&content(ContentFormat::JsonSchema(schema.clone()))).unwrap_err();
            assert_eq!(
                e.param().as_deref(),
                Some("response_format"),
                "{schema}: {e}"
            );
            let e = compile(&one_tool(schema.clone(), true)).unwrap_err();
            assert_eq!(
                e.param().as_deref(),
                Some("tools[0].function.parameters"),
                "{schema}: {e}"
            );
            // Not strict: any object instead.
            let mut c = compile(&one_tool(schema.clone(), false)).unwrap();
            assert_eq!(
                feed(&mut c, &call_ids("f", r#"{"b": 1}"#)),
                Ok(()),
                "{schema}"
            );
        }
        // Recursion with a way out is fine: a nullable self, an optional self, an empty list.
        for (schema, instance) in [
            (
                json!({"anyOf": [{"type": "null"}, {"type": "object",
                       "properties": {"next": {"$ref": "#"}}, "required": ["next"]}]}),
                r#"{"next": {"next": null}}"#,
            ),
            (
                json!({"type": "object", "properties": {"next": {"$ref": "#"}}}),
                r#"{"next": {}}"#,
            ),
            (
                json!({"type": "object", "properties": {"children": {"type": "array",
                       "items": {"$ref": "#"}}}, "required": ["children"]}),
                r#"{"children": [{"children": []}]}"#,
            ),
        ] {
            let mut c = compile(&content(ContentFormat::JsonSchema(schema.clone()))).unwrap();
            assert_eq!(feed(&mut c, &text(instance)), Ok(()), "{schema}");
            assert!(c.is_accepting(), "{schema}");
        }
    }

    #[test]
    fn a_schema_thousands_of_references_deep_compiles_on_any_thread() {
        // A chain of 2000 `$defs`, each an object whose property refers to the next: llguidance
        // recurses once per level, past a default 2 MiB thread stack.
        let mut defs = serde_json::Map::new();
        for i in 0..2000 {
            defs.insert(
                format!("a{i}"),
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}}}),
            );
        }
        defs.insert("a2000".to_owned(), json!({"type": "integer"}));
        let schema = json!({"$ref": "#/$defs/a0", "$defs": defs});
        let mut c = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || compile(&content(ContentFormat::JsonSchema(schema))))
            .expect("a thread")
            .join()
            .expect("no overflow")
            .expect("compiles");
        assert_eq!(feed(&mut c, &text(r#"{"x": {"x": {}}}"#)), Ok(()));
    }

    #[test]
    fn strict_tool_arguments_are_always_an_object() {
        for parameters in [
            json!({}),
            json!(true),
            json!({"anyOf": [{"type": "object"}, {"type": "integer"}]}),
        ] {
            for args in ["null", r#""s""#, "1", "[]"] {
                let mut c = compile(&one_tool(parameters.clone(), true)).unwrap();
                assert!(
                    feed(&mut c, &call_ids("f", args)).is_err(),
                    "{parameters}: {args}"
                );
            }
            let mut c = compile(&one_tool(parameters.clone(), true)).unwrap();
            assert_eq!(feed(&mut c, &call_ids("f", "{}")), Ok(()), "{parameters}");
        }
        // Omitted parameters are an empty list: `{}` only.
        let mut spec = one_tool(json!({}), true);
        spec.tools.as_mut().unwrap().tools[0].parameters = None;
        let mut c = compile(&spec).unwrap();
        assert!(feed(&mut c, &call_ids("f", r#"{"a": 1}"#)).is_err());
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &call_ids("f", "{}")), Ok(()));
        // A const object stays satisfiable: closing objects leaves a fixed value alone.
        let mut c = compile(&one_tool(json!({"const": {"a": 1}}), true)).unwrap();
        assert_eq!(feed(&mut c, &call_ids("f", r#"{"a": 1}"#)), Ok(()));
        for parameters in [json!({"type": "integer"}), json!(false), json!([1])] {
            let e = compile(&one_tool(parameters.clone(), true)).unwrap_err();
            assert_eq!(
                e.param().as_deref(),
                Some("tools[0].function.parameters"),
                "{parameters}: {e}"
            );
            assert!(e.to_string().contains("object"), "{e}");
        }
    }

    #[test]
    fn a_rejected_commit_is_an_error() {
        let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
        let id = text("x")[0];
        assert!(matches!(
            c.commit(id),
            Err(GrammarError::TokenRejected { id: i, .. }) if i == id
        ));
    }

    #[test]
    fn reasoning_prefix_is_optional_and_free_text() {
        let spec = GrammarSpec {
            reasoning: true,
            ..content(ContentFormat::JsonObject)
        };
        let mut ids = vec![special("[THINK]")];
        ids.extend(text("Think: {\"no\" JSON here\n} [TOOL_CALLS]"));
        ids.push(special("[/THINK]"));
        ids.extend(text(r#"{"a": 1}"#));
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &ids), Ok(()));
        assert!(c.is_accepting());
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &text(r#"{"a": 1}"#)), Ok(()));
        // Inside the thinking, control tokens other than [/THINK] are refused.
        let mut c = compile(&spec).unwrap();
        assert_eq!(
            feed(&mut c, &[special("[THINK]"), special("[TOOL_CALLS]")]),
            Err(1)
        );
        // Without reasoning, [THINK] is refused.
        let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
        assert_eq!(feed(&mut c, &[special("[THINK]")]), Err(0));
    }

    #[test]
    fn text_without_tools_allows_any_text_and_eos() {
        let mut c = compile(&content(ContentFormat::Text)).unwrap();
        assert!(allowed(&mut c, tok().eos_id()));
        assert_eq!(feed(&mut c, &text("Any text, even {\"json\"}.\n")), Ok(()));
        assert!(allowed(&mut c, tok().eos_id()));
        assert!(!allowed(&mut c, special("[TOOL_CALLS]")));
        let out = run(&mut c, 7, 1.0, 20);
        assert!(!out.ids.iter().any(|&i| tok().is_control(i)));
    }

    #[test]
    fn auto_with_json_content_takes_json_or_calls() {
        let spec = GrammarSpec {
            content: ContentFormat::JsonObject,
            ..weather_tools(ToolChoice::Auto, false)
        };
        let call = call_ids("get_time", "{}");
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &call), Ok(()));
        // Content or calls, never both in one message.
        let mut c = compile(&spec).unwrap();
        let json = text(r#"{"x": null}"#);
        let mut ids = json.clone();
        ids.extend(&call);
        assert_eq!(feed(&mut c, &ids), Err(json.len()));
        let mut c = compile(&spec).unwrap();
        assert_eq!(feed(&mut c, &text("plain")), Err(0));
    }

    #[test]
    fn strict_schemas_close_objects_as_openai_strict_mode() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "open": {"type": "object", "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"y": {}}}}
            },
            "$defs": {"d": {"type": ["object", "null"]}},
            "anyOf": [{"type": "object"}],
            "x-guidance": {"whitespace_flexible": true}
        });
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(
            s["properties"]["properties"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(s["properties"]["open"]["additionalProperties"], json!(true));
        assert_eq!(
            s["properties"]["list"]["items"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(s["$defs"]["d"]["additionalProperties"], json!(false));
        assert_eq!(s["anyOf"][0]["additionalProperties"], json!(false));
        assert!(s.get("x-guidance").is_none());
        // End to end: an extra key is refused under a strict schema, allowed under json_object.
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let extra = text(r#"{"a": 1, "b": 2}"#);
        let mut c = compile(&content(ContentFormat::JsonSchema(schema))).unwrap();
        assert!(feed(&mut c, &extra).is_err());
        let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
        assert_eq!(feed(&mut c, &extra), Ok(()));
    }

    #[test]
    fn client_errors_name_the_parameter() {
        let unsupported = json!({"type": "array", "uniqueItems": true});
        let e = compile(&content(ContentFormat::JsonSchema(unsupported.clone()))).unwrap_err();
        assert!(matches!(
            &e,
            GrammarError::Schema {
                site: SchemaSite::ResponseFormat,
                ..
            }
        ));
        assert_eq!(e.param().as_deref(), Some("response_format"));
        assert!(e.to_string().contains("uniqueItems"), "{e}");

        let mut spec = weather_tools(ToolChoice::Auto, false);
        let tools = &mut spec.tools.as_mut().unwrap().tools;
        tools[1].parameters = Some(json!({"type": "object", "properties": {"x": unsupported}}));
        tools[1].strict = true;
        let e = compile(&spec).unwrap_err();
        assert_eq!(
            e.param().as_deref(),
            Some("tools[1].function.parameters"),
            "{e}"
        );
        // Not strict: a schema the engine cannot enforce falls back to any object.
        spec.tools.as_mut().unwrap().tools[1].strict = false;
        let mut c = compile(&spec).unwrap();
        assert_eq!(
            feed(&mut c, &call_ids("get_time", r#"{"x": [1, 2]}"#)),
            Ok(())
        );

        let bad_ref = json!({"$ref": "#/$defs/missing"});
        let e = compile(&content(ContentFormat::JsonSchema(bad_ref))).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("response_format"), "{e}");
        let unsat = json!({"type": "integer", "minimum": 5, "maximum": 1});
        let e = compile(&content(ContentFormat::JsonSchema(unsat))).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("response_format"), "{e}");

        let e = compile(&weather_tools(
            ToolChoice::Function("nope".to_owned()),
            false,
        ));
        assert_eq!(
            e.unwrap_err(),
            GrammarError::UnknownToolChoice("nope".to_owned())
        );
        let mut spec = weather_tools(ToolChoice::Required, false);
        spec.tools.as_mut().unwrap().tools.clear();
        assert_eq!(compile(&spec).unwrap_err(), GrammarError::NoTools);
        let mut spec = weather_tools(ToolChoice::Auto, false);
        spec.tools.as_mut().unwrap().tools[1].name = "get_weather".to_owned();
        let e = compile(&spec).unwrap_err();
        assert_eq!(e.param().as_deref(), Some("tools[1]"), "{e}");
    }

    #[test]
    fn the_decode_loop_ends_on_a_constraint_failure() {
        struct Short;
        impl Stepper for Short {
            fn reset(&mut self) {}
            fn kv_max(&self) -> usize {
                64
            }
            fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
                Ok(vec![0.0; tokens.len() * (tok().n_vocab() - 1)])
            }
        }
        let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
        let params = GenerateParams {
            max_tokens: 4,
            sampling: SamplingParams::default(),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            eos_ids: vec![tok().eos_id()],
            keep_prompt_logits: false,
            logprobs: None,
        };
        let e = generate(&mut Short, &[1], &params, Some(&mut c), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                crate::generate::GenerateError::Constraint(GrammarError::VocabMismatch { .. })
            ),
            "{e}"
        );
    }

    #[test]
    fn short_logits_are_an_error() {
        let mut c = compile(&content(ContentFormat::JsonObject)).unwrap();
        let mut logits = vec![0.0; tok().n_vocab() - 1];
        assert!(matches!(
            c.apply(&mut logits),
            Err(GrammarError::VocabMismatch { .. })
        ));
        let mut longer = vec![0.0; tok().n_vocab() + 3];
        c.apply(&mut longer).unwrap();
        assert!(longer[tok().n_vocab()..]
            .iter()
            .all(|l| *l == f32::NEG_INFINITY));
    }
}
