package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

func ExampleNewHandler() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	h := NewHandler(g, &Ledger{})

	for _, r := range []struct{ op, body string }{
		{"deposit", `{"amount": 100}`},
		{"withdraw", `{"amount": 30}`},
		{"withdraw", `{"amount": 500}`}, // more than the balance
	} {
		req := httptest.NewRequest("POST", "/accounts/42/"+r.op, strings.NewReader(r.body))
		req.Header.Set(TenantHeader, "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Body)
	}
	// Output:
	// 200 {"tenant":"acme","account":"42","balance":100,"fence":1}
	// 200 {"tenant":"acme","account":"42","balance":70,"fence":2}
	// 409 {"type":"about:blank","title":"Conflict","status":409,"detail":"Insufficient funds: the amount is larger than the balance."}
}

// A write made under an older lock than one the ledger has seen is rejected.
func ExampleLedger() {
	var ledger Ledger
	acct := Account{Tenant: "acme", ID: "42"}

	paused, _ := ledger.Begin(acct, 7) // a holder with fence 7 reads, then pauses
	next, _ := ledger.Begin(acct, 8)   // its lock expired; the next holder has fence 8
	fmt.Println(next.Commit(100))
	err := paused.Commit(50)
	fmt.Println(errors.Is(err, ErrStaleFence))
	balance, fence, _ := ledger.Balance(context.Background(), acct)
	fmt.Println(balance, fence)
	// Output:
	// <nil>
	// true
	// 100 8
}
