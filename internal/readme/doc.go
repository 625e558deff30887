// Package readme holds no code: its test compiles the README's quick start and checks that the
// README shows exactly that code.
package readme
