// Package lockname compiles lock-name templates and renders them injectively.
//
// A template is literal text with placeholders in braces: "tenant:{Tenant.ID}:import:{Kind}".
// In literal text "{{" stands for "{" and "}}" for "}". What a placeholder's key means (a field
// path, a URL parameter, a header) is up to the package that binds it: Template only parses,
// escapes, renders and parses rendered names back, and uses no reflection.
//
// Bind is the glue that package decorators and package middleware share: it binds each key of
// a template to a Source of its value and reports every problem as a *guard.NameError, at
// construction for the template and on each call for the values. CallOptions builds the
// options of their acquisitions.
//
// # Injectivity
//
// Render copies a value's letters, marks, decimal digits and "-._~" (RFC 3986's unreserved
// marks) — the word runes — and percent-encodes ("%XX", upper-case hex, byte by byte) every
// other rune and every byte that is not valid UTF-8. The rule is the same for every template,
// so "orders:{ID}" with ID "A-17" renders "orders:A-17" and with "7:items" renders
// "orders:7%3Aitems". Parse keeps literal text to the other side of it: literal text holds no
// '%', and a placeholder stands between separators (runes values never hold unescaped) or at
// an end of the template — "a:{x}:b" parses, "a{x}", "{x}-b" and "{A}.{B}" do not, nor do
// two placeholders with no literal text between them. Render rejects empty values.
//
// A name therefore splits into separator runs and words (runs of word runes and escapes) in
// one way, whatever template rendered it, and each value is exactly one of its words. So:
//
//   - within a template, two different value tuples never render the same name; Values
//     parses a name back into its values;
//   - two templates render the same name only if they have the same separators in the same
//     places and, word for word, the same literal text wherever both have literal text:
//     "repo:{Owner}" and "repo:{Owner}/{Repo}" never share a name, and neither do
//     "digest:{T}" and "digest:{T}:weekly"; "tenant:{T}:import:{K}" and "tenant:{T}:{U}:{K}"
//     share the names whose U is "import".
//
// Rendered names are valid UTF-8 and contain no control characters and no braces besides the
// template's own.
package lockname
