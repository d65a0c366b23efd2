"""Promotion: an LLM-planned subtree that ran well becomes a versioned method of its pack.

- `methods`: promoted methods as planning reads them (guards, the stored subtree, the hash check).
- `actions`: propose, approve (a second officer or admin), reject and retire, each audited.
- `views`: the Methods pages and the promote form.
"""
