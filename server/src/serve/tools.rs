//! The structured-output parameters of `/v1/chat/completions`: `tools`, `tool_choice`,
//! `parallel_tool_calls` and `response_format` (OpenAI API reference, Chat Completions), checked
//! and turned into the grammar the decode loop enforces
//! (`aubier_runtime::text::grammar::GrammarSpec`).
//!
//! Contract: the objects arrive as wire types (`super::api::request`: unknown keys already refused
//! by name, as `tools[0].function.foo`); function and schema names match `^[a-zA-Z0-9_-]{1,64}$`
//! and function names are distinct; a `tool_choice` naming a function names one of `tools`; `required` or a named
//! function without tools is refused. The grammar: with tools and `tool_choice` other than `none`,
//! calls are read and their arguments constrained (a `strict` function's against its
//! `parameters`); `tool_choice: none` forbids calls; `response_format` constrains the content.
//! Without tools and with a text format there is no grammar at all.

use super::api::request::{
    FormatType, JsonSchemaFormat, NamedToolChoice, ResponseFormat, Tool, ToolChoice,
    ToolChoiceMode, NAME_PATTERN,
};
use super::api::scalar::StrOr;
use super::error::{missing_parameter, unknown_parameter, ApiError};
use aubier_runtime::text::grammar::{
    Constraint, ContentFormat, GrammarCompiler, GrammarError, GrammarSpec, SchemaSite,
    ToolChoice as GrammarChoice, ToolSpec, ToolsSpec,
};
use serde_json::Value;

/// What the structured-output parameters of one request ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct Structured {
    /// The grammar to enforce; `None` = free text.
    pub grammar: Option<GrammarSpec>,
    /// Read `[TOOL_CALLS]…` in the output as tool calls.
    pub tool_calls: bool,
}

/// Whether `name` is a valid OpenAI function / schema name ([`NAME_PATTERN`]).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `name` when it is valid. Errors: 400 naming `param`.
fn checked_name(param: &str, name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_value(
            param,
            format!("'{param}' must match {NAME_PATTERN}, got {name:?}."),
        ))
    }
}

/// The tools as the grammar takes them.
///
/// Errors: 400 naming a bad or repeated function name.
fn tool_specs(tools: &[Tool]) -> Result<Vec<ToolSpec>, ApiError> {
    let mut out: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let param = format!("tools[{i}].function.name");
        let name = &tool.function.name;
        checked_name(&param, name)?;
        if out.iter().any(|t| &t.name == name) {
            return Err(ApiError::bad_value(
                &param,
                format!("'{param}' {name:?} names an earlier tool too; names must be distinct."),
            ));
        }
        out.push(ToolSpec {
            name: name.clone(),
            parameters: tool.function.parameters.clone().map(Value::Object),
            strict: tool.function.strict.unwrap_or(false),
        });
    }
    Ok(out)
}

/// `response_format` as the grammar takes it. The schema is enforced whether or not `strict` is
/// set (as vLLM does).
///
/// Errors: 400 naming a bad schema name.
/// Errors: 400 naming a bad schema name, a missing `json_schema` with type `json_schema`, or one
/// sent with another type.
fn content_format(format: Option<ResponseFormat>) -> Result<ContentFormat, ApiError> {
    let Some(ResponseFormat { kind, json_schema }) = format else {
        return Ok(ContentFormat::Text);
    };
    match (kind, json_schema) {
        (FormatType::JsonSchema, Some(JsonSchemaFormat { name, schema, .. })) => {
            checked_name("response_format.json_schema.name", &name)?;
            Ok(ContentFormat::JsonSchema(Value::Object(schema)))
        }
        (FormatType::JsonSchema, None) => Err(missing_parameter("response_format.json_schema")),
        (_, Some(_)) => Err(unknown_parameter("response_format.json_schema")),
        (FormatType::Text, None) => Ok(ContentFormat::Text),
        (FormatType::JsonObject, None) => Ok(ContentFormat::JsonObject),
    }
}

/// Resolves the structured-output parameters of one request (each `None` when absent or
/// `null`); `reasoning` = the request asks for `reasoning_effort: high`.
///
/// Errors: 400 naming the parameter at fault (see the module note).
pub fn structured(
    tools: &[Tool],
    tool_choice: Option<ToolChoice>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<ResponseFormat>,
    reasoning: bool,
) -> Result<Structured, ApiError> {
    let tools = tool_specs(tools)?;
    let content = content_format(response_format)?;
    let choice = tool_choice.unwrap_or(StrOr::Str(ToolChoiceMode::Auto));
    let none_with_tools = choice == StrOr::Str(ToolChoiceMode::None) && !tools.is_empty();
    let choice = match choice {
        StrOr::Str(ToolChoiceMode::None) => None,
        StrOr::Str(ToolChoiceMode::Auto) => Some(GrammarChoice::Auto),
        StrOr::Str(ToolChoiceMode::Required) if tools.is_empty() => {
            return Err(ApiError::bad_value(
                "tool_choice",
                "'tool_choice' \"required\" needs at least one tool in 'tools'.",
            ))
        }
        StrOr::Str(ToolChoiceMode::Required) => Some(GrammarChoice::Required),
        StrOr::Other(NamedToolChoice { function, .. }) => {
            let name = function.name;
            checked_name("tool_choice.function.name", &name)?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::bad_value(
                    "tool_choice.function.name",
                    format!("'tool_choice.function.name' {name:?} is not one of 'tools'."),
                ));
            }
            Some(GrammarChoice::Function(name))
        }
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
