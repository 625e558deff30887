package main

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdStore keeps the balances in an etcd cluster — the one the locks are in: a key per
// account, "httpapi/account/" and the tenant and the ID as a JSON array, whose value holds
// its balance and the highest fence accepted.
//
// A write is a compare-and-swap: a transaction that puts the new balance only if the
// account's key has the mod revision it had when the balance was read (0: still missing).
// When another write came in between, the transaction returns the key as it is now: if that
// write's fence is higher, Update refuses with ErrStaleFence; if not (the write of a holder
// whose lease ran out, slower than its successor), Update computes the change again on the
// balance that write left, so that neither is lost. Two writers of one account can never
// both write over the same balance, lock or no lock.
type EtcdStore struct {
	kv clientv3.KV
}

// NewEtcdStore returns a Store on the etcd cluster of kv (a *clientv3.Client).
func NewEtcdStore(kv clientv3.KV) *EtcdStore { return &EtcdStore{kv: kv} }

// etcdAccount is an account key's value.
type etcdAccount struct {
	Balance int64  `json:"balance"`
	Fence   uint64 `json:"fence"`
}

func etcdKey(a Account) string {
	b, _ := json.Marshal([]string{a.Tenant, a.ID}) // strings always marshal
	return "httpapi/account/" + string(b)
}

// etcdRead returns the account in a Get's response, and its key's mod revision (0: missing).
func etcdRead(resp *clientv3.GetResponse) (etcdAccount, int64, error) {
	var acct etcdAccount
	if len(resp.Kvs) == 0 {
		return acct, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &acct); err != nil {
		return acct, 0, fmt.Errorf("accounts: key %s: %w", resp.Kvs[0].Key, err)
	}
	return acct, resp.Kvs[0].ModRevision, nil
}

// Balance implements Store.
func (s *EtcdStore) Balance(ctx context.Context, a Account) (int64, uint64, error) {
	resp, err := s.kv.Get(ctx, etcdKey(a))
	if err != nil {
		return 0, 0, err
	}
	acct, _, err := etcdRead(resp)
	return acct.Balance, acct.Fence, err
}

// Update implements Store. change may run more than once: again on the balance another
// writer left, when one wrote between the read and the write.
func (s *EtcdStore) Update(ctx context.Context, a Account, fence uint64, change func(int64) (int64, error)) (int64, error) {
	key := etcdKey(a)
	resp, err := s.kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	for {
		acct, rev, err := etcdRead(resp)
		if err != nil {
			return 0, err
		}
		if fence < acct.Fence {
			return 0, staleFence(a, fence, acct.Fence)
		}
		balance, err := change(acct.Balance)
		if err != nil {
			return 0, err
		}
		b, err := json.Marshal(etcdAccount{Balance: balance, Fence: fence})
		if err != nil {
			return 0, err
		}
		var txn *clientv3.TxnResponse
		err = write(ctx, func(ctx context.Context) (err error) {
			txn, err = s.kv.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
				Then(clientv3.OpPut(key, string(b))).
				Else(clientv3.OpGet(key)).
				Commit()
			return err
		})
		if err != nil {
			return 0, err
		}
		if txn.Succeeded {
			return balance, nil
		}
		resp = (*clientv3.GetResponse)(txn.Responses[0].GetResponseRange())
	}
}
