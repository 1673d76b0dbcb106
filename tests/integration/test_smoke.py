from tests.support.events import FakeLambdaContext, load_event


def test_classify_event_succeeds_through_the_handler_worker(worker, store, provider, dynamodb_requests):
    response = worker.handle(load_event("classify"), FakeLambdaContext())
    assert response == {"batchItemFailures": []}
    job = store.get_job("evt-classify-1")
    assert job.status == "succeeded"
    assert provider.calls == 1
    assert dynamodb_requests.operations == {"UpdateItem": 1, "TransactWriteItems": 1, "GetItem": 1}
