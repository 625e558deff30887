package guard

import (
	"crypto/rand"
	"encoding/base32"
	mrand "math/rand/v2"
	"sync"
)

// tokens makes owner tokens: 128 random bits each, from a ChaCha8 generator seeded from
// crypto/rand — a cryptographically strong stream, without a system call per token — written
// as 26 base32 characters.
type tokens struct {
	mu  sync.Mutex // protects rng
	rng *mrand.ChaCha8
}

// tokenEncoding writes tokens: base32 without padding, as crypto/rand.Text does.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

func newTokens() *tokens {
	var seed [32]byte
	_, _ = rand.Read(seed[:]) // never fails (crypto/rand crashes the program first)
	return &tokens{rng: mrand.NewChaCha8(seed)}
}

// next returns a new token.
func (t *tokens) next() string {
	var raw [16]byte
	t.mu.Lock()
	_, _ = t.rng.Read(raw[:])
	t.mu.Unlock()
	var text [26]byte
	tokenEncoding.Encode(text[:], raw[:])
	return string(text[:])
}
