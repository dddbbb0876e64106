package storage_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stepcollect/stepcollect/storage"
)

// The code survives wrapping (the HTTP mapping reads it through any number
// of fmt.Errorf("…: %w")), and an error without one has none.
func TestErrorCodeSurvivesWrapping(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("storing step (workflow w): %w", storage.Errorf(storage.ETooLarge, "ids: %d, more than %d", 3, 2))
	if storage.ErrorCode(err) != storage.ETooLarge || err.Error() != "storing step (workflow w): ids: 3, more than 2" {
		t.Errorf("code %q, message %q", storage.ErrorCode(err), err)
	}
	if storage.ErrorCode(errors.New("plain")) != "" || storage.ErrorCode(nil) != "" {
		t.Error("a plain error (or nil) has a code")
	}
	wrapped := fmt.Errorf("result (enrollment E): %w", storage.ErrUnknownCommand)
	if !errors.Is(wrapped, storage.ErrUnknownCommand) || storage.ErrorCode(wrapped) != storage.ENotFound {
		t.Errorf("sentinel through wrapping: is=%v code=%q", errors.Is(wrapped, storage.ErrUnknownCommand), storage.ErrorCode(wrapped))
	}
}
