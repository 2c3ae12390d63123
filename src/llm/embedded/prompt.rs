//! The conversation as the model reads it: chat-template messages, with the tools section
//! Qwen2.5 was trained on.

use llama_cpp_2::model::LlamaChatMessage;

use super::*;
use crate::llm::{LlmError, Message, Role};

/// The tools section Qwen2.5's chat template appends to the system message.
pub(super) fn tools_section(tools: &[crate::llm::ToolSpec]) -> String {
    let mut s = String::from(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        let spec = serde_json::json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}});
        s.push('\n');
        s.push_str(&spec.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments \
         within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// The conversation as chat-template messages.
pub(super) fn render(
    messages: &[Message],
    tools: &[crate::llm::ToolSpec],
) -> Result<Vec<LlamaChatMessage>, LlmError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut system_done = false;
    for m in messages {
        let (role, content) = match m.role {
            Role::System if !system_done => {
                system_done = true;
                let mut content = m.content.clone();
                if !tools.is_empty() {
                    content.push_str(&tools_section(tools));
                }
                ("system", content)
            }
            Role::System => ("system", m.content.clone()),
            Role::User => ("user", m.content.clone()),
            Role::Assistant => {
                let mut content = m.content.clone();
                for call in &m.tool_calls {
                    let json = serde_json::json!({"name": call.name, "arguments": call.arguments});
                    content.push_str(&format!("\n{TOOL_OPEN}\n{json}\n{TOOL_CLOSE}"));
                }
                ("assistant", content)
            }
            Role::Tool => (
                "user",
                format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
        };
        out.push(LlamaChatMessage::new(role.into(), content).map_err(engine)?);
    }
    if !system_done && !tools.is_empty() {
        let content = format!("You are a helpful assistant.{}", tools_section(tools));
        out.insert(
            0,
            LlamaChatMessage::new("system".into(), content).map_err(engine)?,
        );
    }
    Ok(out)
}
