//! The structured-output parameters of `/v1/chat/completions`: `tools`, `tool_choice`,
//! `parallel_tool_calls` and `response_format` (OpenAI API reference, Chat Completions), checked
//! and turned into the grammar the decode loop enforces
//! (`aubier_runtime::text::grammar::GrammarSpec`).
//!
//! Contract: every object follows the server's unknown-key policy (known keys taken, anything
//! else a 400 naming it, as `tools[0].function.foo`); function names match `^[a-zA-Z0-9_-]{1,64}$`
//! and are distinct; a `tool_choice` naming a function names one of `tools`; `required` or a named
//! function without tools is refused. The grammar: with tools and `tool_choice` other than `none`,
//! calls are read and their arguments constrained (a `strict` function's against its
//! `parameters`); `tool_choice: none` forbids calls; `response_format` constrains the content.
//! Without tools and with a text format there is no grammar at all.

use super::error::ApiError;
use super::params::{missing_parameter, unknown_parameter, wrong_type};
use aubier_runtime::text::grammar::{
    Constraint, ContentFormat, GrammarCompiler, GrammarError, GrammarSpec, SchemaSite, ToolChoice,
    ToolSpec, ToolsSpec,
};
use serde_json::{Map, Value};

/// What the structured-output parameters of one request ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct Structured {
    /// The grammar to enforce; `None` = free text.
    pub grammar: Option<GrammarSpec>,
    /// Read `[TOOL_CALLS]…` in the output as tool calls.
    pub tool_calls: bool,
}

/// `tool_choice`, before it is resolved against the tools.
enum Choice {
    None,
    Auto,
    Required,
    Function(String),
}

/// Whether `name` is a valid OpenAI function / schema name (`^[a-zA-Z0-9_-]{1,64}$`).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Takes `key` out of `map`; an explicit `null` counts as absent.
fn take(map: &mut Map<String, Value>, key: &str) -> Option<Value> {
    map.remove(key).filter(|v| !v.is_null())
}

/// Refuses the first key of `map` not taken yet, named under `prefix`.
fn no_more(map: &Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
    match map.keys().next() {
        None => Ok(()),
        Some(k) => Err(unknown_parameter(&format!("{prefix}{k}"))),
    }
}

/// `v` as an object, or a 400 naming `name`.
fn object(name: &str, v: Value) -> Result<Map<String, Value>, ApiError> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(wrong_type(name, "an object", &other)),
    }
}

/// A required string field `key` of `map` (named `prefix` + `key`).
fn name_field(map: &mut Map<String, Value>, prefix: &str, key: &str) -> Result<String, ApiError> {
    let full = format!("{prefix}{key}");
    match take(map, key) {
        Some(Value::String(s)) if valid_name(&s) => Ok(s),
        Some(Value::String(s)) => Err(ApiError::bad_value(
            &full,
            format!("'{full}' must match ^[a-zA-Z0-9_-]{{1,64}}$, got {s:?}."),
        )),
        Some(other) => Err(wrong_type(&full, "a string", &other)),
        None => Err(missing_parameter(&full)),
    }
}

/// An optional boolean field.
fn flag(map: &mut Map<String, Value>, prefix: &str, key: &str) -> Result<bool, ApiError> {
    match take(map, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(b),
        Some(other) => Err(wrong_type(&format!("{prefix}{key}"), "a boolean", &other)),
    }
}

/// An optional string field, checked and dropped (descriptions only shape the prompt).
fn description(map: &mut Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
    match take(map, "description") {
        None | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(wrong_type(
            &format!("{prefix}description"),
            "a string",
            &other,
        )),
    }
}

/// An optional JSON-schema object field.
fn schema(
    map: &mut Map<String, Value>,
    prefix: &str,
    key: &str,
) -> Result<Option<Value>, ApiError> {
    match take(map, key) {
        None => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(other) => Err(wrong_type(&format!("{prefix}{key}"), "an object", &other)),
    }
}

/// Checks `tools` (the request's value, also handed to the chat template as it is).
///
/// Errors: 400 naming the field at fault.
fn parse_tools(tools: &Value) -> Result<Vec<ToolSpec>, ApiError> {
    let Value::Array(list) = tools else {
        return Err(wrong_type("tools", "an array", tools));
    };
    let mut out: Vec<ToolSpec> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let prefix = format!("tools[{i}].");
        let mut tool = object(&format!("tools[{i}]"), tool.clone())?;
        match take(&mut tool, "type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(other) => {
                return Err(ApiError::bad_value(
                    &format!("{prefix}type"),
                    format!("'{prefix}type' must be \"function\", got {other}."),
                ))
            }
            None => return Err(missing_parameter(&format!("{prefix}type"))),
        }
        let fprefix = format!("{prefix}function.");
        let function = take(&mut tool, "function")
            .ok_or_else(|| missing_parameter(&format!("{prefix}function")))?;
        no_more(&tool, &prefix)?;
        let mut function = object(&format!("{prefix}function"), function)?;
        let name = name_field(&mut function, &fprefix, "name")?;
        description(&mut function, &fprefix)?;
        let parameters = schema(&mut function, &fprefix, "parameters")?;
        let strict = flag(&mut function, &fprefix, "strict")?;
        no_more(&function, &fprefix)?;
        if out.iter().any(|t| t.name == name) {
            return Err(ApiError::bad_value(
                &format!("{fprefix}name"),
                format!(
                    "'{fprefix}name' {name:?} names an earlier tool too; names must be distinct."
                ),
            ));
        }
        out.push(ToolSpec {
            name,
            parameters,
            strict,
        });
    }
    Ok(out)
}

/// Checks `tool_choice`: `"none"`, `"auto"`, `"required"` or
/// `{"type": "function", "function": {"name": …}}`.
fn parse_choice(v: Value) -> Result<Choice, ApiError> {
    match v {
        Value::String(s) => match s.as_str() {
            "none" => Ok(Choice::None),
            "auto" => Ok(Choice::Auto),
            "required" => Ok(Choice::Required),
            _ => Err(ApiError::bad_value(
                "tool_choice",
                format!(
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or a function object, got {s:?}."
                ),
            )),
        },
        Value::Object(mut m) => {
            match take(&mut m, "type") {
                Some(Value::String(t)) if t == "function" => {}
                _ => {
                    return Err(ApiError::bad_value(
                        "tool_choice.type",
                        "'tool_choice.type' must be \"function\".",
                    ))
                }
            }
            let function = take(&mut m, "function").ok_or_else(|| {
                missing_parameter("tool_choice.function")
            })?;
            no_more(&m, "tool_choice.")?;
            let mut f = object("tool_choice.function", function)?;
            let name = name_field(&mut f, "tool_choice.function.", "name")?;
            no_more(&f, "tool_choice.function.")?;
            Ok(Choice::Function(name))
        }
        other => Err(wrong_type("tool_choice", "a string or an object", &other)),
    }
}

/// Checks `response_format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "description"?, "schema", "strict"?}}`.
/// The schema is enforced whether or not `strict` is set (as vLLM does).
fn parse_format(v: Value) -> Result<ContentFormat, ApiError> {
    let mut m = object("response_format", v)?;
    let kind = match take(&mut m, "type") {
        Some(Value::String(t)) => t,
        Some(other) => return Err(wrong_type("response_format.type", "a string", &other)),
        None => return Err(missing_parameter("response_format.type")),
    };
    let format = match kind.as_str() {
        "text" => ContentFormat::Text,
        "json_object" => ContentFormat::JsonObject,
        "json_schema" => {
            let prefix = "response_format.json_schema.";
            let js = take(&mut m, "json_schema").ok_or_else(|| {
                missing_parameter("response_format.json_schema")
            })?;
            let mut js = object("response_format.json_schema", js)?;
            name_field(&mut js, prefix, "name")?;
            description(&mut js, prefix)?;
            flag(&mut js, prefix, "strict")?;
            let schema = schema(&mut js, prefix, "schema")?.ok_or_else(|| {
                missing_parameter("response_format.json_schema.schema")
            })?;
            no_more(&js, prefix)?;
            ContentFormat::JsonSchema(schema)
        }
        other => {
            return Err(ApiError::bad_value(
                "response_format.type",
                format!(
                    "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got {other:?}."
                ),
            ))
        }
    };
    no_more(&m, "response_format.")?;
    Ok(format)
}

/// Resolves the structured-output parameters of one request (each `None` when absent or
/// `null`); `reasoning` = the request asks for `reasoning_effort: high`.
///
/// Errors: 400 naming the parameter at fault (see the module note).
pub fn structured(
    tools: Option<&Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<Value>,
    reasoning: bool,
) -> Result<Structured, ApiError> {
    let tools = match tools {
        Some(t) => parse_tools(t)?,
        None => Vec::new(),
    };
    let choice = match tool_choice {
        Some(v) => parse_choice(v)?,
        None => Choice::Auto,
    };
    let content = match response_format {
        Some(v) => parse_format(v)?,
        None => ContentFormat::Text,
    };
    let none_with_tools = matches!(choice, Choice::None) && !tools.is_empty();
    let choice = match choice {
        Choice::None => None,
        Choice::Auto => Some(ToolChoice::Auto),
        Choice::Required if tools.is_empty() => {
            return Err(ApiError::bad_value(
                "tool_choice",
                "'tool_choice' \"required\" needs at least one tool in 'tools'.",
            ))
        }
        Choice::Required => Some(ToolChoice::Required),
        Choice::Function(name) if !tools.iter().any(|t| t.name == name) => {
            return Err(ApiError::bad_value(
                "tool_choice.function.name",
                format!("'tool_choice.function.name' {name:?} is not one of 'tools'."),
            ))
        }
        Choice::Function(name) => Some(ToolChoice::Function(name)),
    };
    let tools_spec = match choice {
        Some(choice) if !tools.is_empty() => Some(ToolsSpec {
            tools,
            choice,
            parallel: parallel_tool_calls.unwrap_or(true),
        }),
        _ => None,
    };
    let tool_calls = tools_spec.is_some();
    // With tools but `tool_choice: none`, a grammar still runs: it forbids `[TOOL_CALLS]`.
    let constrained = tool_calls || none_with_tools || !matches!(content, ContentFormat::Text);
    let grammar = constrained.then_some(GrammarSpec {
        reasoning,
        content,
        tools: tools_spec,
    });
    Ok(Structured {
        grammar,
        tool_calls,
    })
}

/// Compiles `spec` with `compiler`.
///
/// Errors: 400 `invalid_value` naming the part the grammar engine refused (`response_format`,
/// `tools[i].function.parameters`, `tool_choice`), with its reason; 500 for an engine failure that
/// is not the request's.
pub fn compile(compiler: &GrammarCompiler, spec: &GrammarSpec) -> Result<Constraint, ApiError> {
    compiler.compile(spec).map_err(|e| {
        let param = match &e {
            GrammarError::Schema {
                site: SchemaSite::Tool(i),
                ..
            } => Some(format!("tools[{i}].function.parameters")),
            _ => e.param(),
        };
        match param {
            Some(param) => ApiError::bad_value(
                &param,
                format!("'{param}' cannot be enforced as a grammar: {e}."),
            ),
            None => ApiError::internal(format!("The grammar engine failed: {e}.")),
        }
    })
}
