"""Who may use the desk: the users file and its password hashes (:mod:`.accounts`,
:mod:`.passwords`), logins checked off the event loop and throttled (:mod:`.logins`),
signed session cookies and logouts every replica honours (:mod:`.sessions`), and which
proxy headers are believed (:mod:`.proxies`)."""
