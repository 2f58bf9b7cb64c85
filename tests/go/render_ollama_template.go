// Reads an Ollama Modelfile and renders its TEMPLATE the way Ollama's /api/chat renders a request, for
// tests/features/export/test_ollama_template.py. Standard library only (Go 1.19 or later, no module downloads):
//
//	go build -o render render_ollama_template.go && ./render < request.json
//
// stdin:  {"modelfile": the Modelfile's text, "conversations": [[{"role", "content"}, ...], ...]}
// stdout: {"commands": [[name, value], ...] as Ollama reads them (FROM is "model", PARAMETER NAME is NAME),
//
//	"renders": [one prompt per conversation]}
//
// What it reproduces of Ollama (github.com/ollama/ollama: parser/parser.go, server/routes.go's chat
// handler, template/template.go), written from their behaviour:
//   - the Modelfile: COMMAND VALUE per line, # comments; a value in """...""" or "..." may hold
//     newlines and ends at the first line end where it is closed; characters other than newlines, spaces,
//     tabs and printable ones (strconv.IsPrint) are dropped.
//   - the request: the Modelfile's SYSTEM goes first when the first message is not a system one; runs of
//     messages of one role (tool results apart) become one message, their contents joined by "\n\n";
//     .System is every system message's content, joined by "\n\n".
//   - the template: text/template with missingkey=zero and Ollama's one added function, json; executed
//     with .System, .Messages, .Tools, .Response "" and .Think false. Templates that read no .Messages
//     (Ollama's older .Prompt/.Response form) are refused here: tunesmith writes none.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
)

type ToolCallFunction struct {
	Index     int            `json:"index,omitempty"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

type ToolCall struct {
	ID       string           `json:"id,omitempty"`
	Function ToolCallFunction `json:"function"`
}

// The fields of Ollama's api.Message.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Thinking   string     `json:"thinking,omitempty"`
	Images     []string   `json:"images,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolName   string     `json:"tool_name,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type Request struct {
	Modelfile     string           `json:"modelfile"`
	Conversations [][]Message      `json:"conversations"`
	Tools         []map[string]any `json:"tools"`
}

type Reply struct {
	Commands [][2]string `json:"commands"`
	Renders  []string    `json:"renders"`
}

func isLetter(r byte) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

func word(text string, i int, ok func(byte) bool) (string, int) {
	start := i
	for i < len(text) && ok(text[i]) {
		i++
	}
	return text[start:i], i
}

// unquoted: the value inside """...""" or "...", or a bare one as it is; false while a quote is open.
func unquoted(s string) (string, bool) {
	if strings.HasPrefix(s, `"""`) {
		if len(s) >= 6 && strings.HasSuffix(s, `"""`) {
			return s[3 : len(s)-3], true
		}
		return "", false
	}
	if strings.HasPrefix(s, `"`) {
		if len(s) >= 2 && strings.HasSuffix(s, `"`) {
			return s[1 : len(s)-1], true
		}
		return "", false
	}
	return s, true
}

func kept(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == ' ' || r == '\t' || strconv.IsPrint(r) {
			return r
		}
		return -1
	}, s)
}

func parseModelfile(text string) ([][2]string, error) {
	var commands [][2]string
	i := 0
	for i < len(text) {
		switch c := text[i]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			i++
			continue
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				i++
			}
			continue
		}
		name, j := word(text, i, isLetter)
		name = strings.ToLower(name)
		if name == "parameter" || name == "message" {
			j++ // the space
			name, j = word(text, j, func(b byte) bool { return isLetter(b) || b >= '0' && b <= '9' || b == '_' })
		} else if name == "from" {
			name = "model"
		}
		if name == "" || j >= len(text) || (text[j] != ' ' && text[j] != '\t') {
			return nil, fmt.Errorf("byte %d: expected COMMAND VALUE", i)
		}
		// The value runs to the first line end (or the end of the file) where it is complete.
		for end := j; ; end++ {
			if end == len(text) || text[end] == '\n' || text[end] == '\r' {
				if value, ok := unquoted(strings.TrimSpace(kept(text[j:end]))); ok {
					commands = append(commands, [2]string{name, value})
					i = end
					break
				}
				if end == len(text) {
					return nil, errors.New("unexpected end of file: a quote is not closed")
				}
			}
		}
	}
	return commands, nil
}

var funcs = template.FuncMap{
	"json": func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	},
}

// readsMessages: whether the template names .Messages anywhere.
func readsMessages(node parse.Node) bool {
	found := false
	var walk func(parse.Node)
	walk = func(n parse.Node) {
		switch n := n.(type) {
		case *parse.ListNode:
			if n != nil {
				for _, c := range n.Nodes {
					walk(c)
				}
			}
		case *parse.ActionNode:
			walk(n.Pipe)
		case *parse.IfNode:
			walk(&n.BranchNode)
		case *parse.RangeNode:
			walk(&n.BranchNode)
		case *parse.WithNode:
			walk(&n.BranchNode)
		case *parse.BranchNode:
			walk(n.Pipe)
			walk(n.List)
			if n.ElseList != nil {
				walk(n.ElseList)
			}
		case *parse.PipeNode:
			if n != nil {
				for _, c := range n.Cmds {
					for _, a := range c.Args {
						walk(a)
					}
				}
			}
		case *parse.FieldNode:
			for _, id := range n.Ident {
				found = found || strings.EqualFold(id, "messages")
			}
		}
	}
	walk(node)
	return found
}

func render(tmpl *template.Template, system string, conversation []Message, tools []map[string]any) (string, error) {
	msgs := conversation
	if len(msgs) > 0 && msgs[0].Role != "system" && system != "" {
		msgs = append([]Message{{Role: "system", Content: system}}, msgs...)
	}
	var systems []string
	var merged []*Message
	for k := range msgs {
		m := msgs[k]
		if m.Role == "system" {
			systems = append(systems, m.Content)
		}
		if n := len(merged); n > 0 && merged[n-1].Role == m.Role && m.Role != "tool" {
			merged[n-1].Content += "\n\n" + m.Content
			continue
		}
		merged = append(merged, &m)
	}
	var b strings.Builder
	err := tmpl.Execute(&b, map[string]any{
		"System": strings.Join(systems, "\n\n"), "Messages": merged, "Tools": tools, "Response": "",
		"Think": false, "IsThinkSet": false,
	})
	return b.String(), err
}

func run() error {
	var req Request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	commands, err := parseModelfile(req.Modelfile)
	if err != nil {
		return fmt.Errorf("reading the Modelfile: %w", err)
	}
	var source, system string
	for _, c := range commands {
		switch c[0] {
		case "template":
			source = c[1]
		case "system":
			system = c[1]
		}
	}
	tmpl, err := template.New("").Option("missingkey=zero").Funcs(funcs).Parse(source)
	if err != nil {
		return fmt.Errorf("parsing the TEMPLATE: %w", err)
	}
	if !readsMessages(tmpl.Tree.Root) {
		return errors.New("the TEMPLATE reads no .Messages (Ollama's .Prompt/.Response form is not rendered here)")
	}
	reply := Reply{Commands: commands, Renders: []string{}}
	for _, conversation := range req.Conversations {
		text, err := render(tmpl, system, conversation, req.Tools)
		if err != nil {
			return fmt.Errorf("rendering: %w", err)
		}
		reply.Renders = append(reply.Renders, text)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	return out.Encode(reply)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
