"""run_dir on S3-compatible object storage: `run_dir=s3://BUCKET/PREFIX`.

A run works in a local working copy of the prefix (location.py says where) and this package
keeps the two in step: it fetches what a run or a reader needs (mirror.py), uploads what a
run writes, and makes a checkpoint count in the store only once every byte of it is there.
store.py is the one place that talks to the store (boto3, whose credential chain is the AWS
CLI's own).
"""
